"""When something usually quick is overdue: once it has taken longer than the slowest of the
last `window` times it took, by OVERDUE_FACTOR plus OVERDUE_SLACK_S. A lost or hung answer then
shows within tens of milliseconds of its usual time instead of after a fixed timeout, and the
limit follows a host that has become slower."""

from __future__ import annotations

from collections import deque

OVERDUE_FACTOR = 1.25
OVERDUE_SLACK_S = 0.03  # s: scheduling noise on a loaded host beyond the slowest recent one
DURATION_WINDOW = 20


class DurationWatch:
    """The recent durations of one kind of step; `limit_s()` is None until `warmup` of them
    have been timed."""

    def __init__(self, warmup: int, window: int = DURATION_WINDOW):
        self.durations: deque[float] = deque(maxlen=window)
        self.warmup = max(int(warmup), 1)

    def append(self, duration_s: float) -> None:
        self.durations.append(float(duration_s))

    def limit_s(self) -> float | None:
        if len(self.durations) < self.warmup:
            return None
        return OVERDUE_FACTOR * max(self.durations) + OVERDUE_SLACK_S

    def overdue(self, elapsed_s: float) -> bool:
        limit = self.limit_s()
        return limit is not None and elapsed_s > limit
