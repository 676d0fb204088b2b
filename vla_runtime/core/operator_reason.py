"""The operator's stated reason for a reset or a recovery: published shortly before the request
(on /vla/operator/reason), consumed by it, and logged with it. A request without a fresh reason
is refused, so that every way out of a stop leaves a record of why."""

from __future__ import annotations

import math

REASON_MAX_AGE_S = 60.0  # s a stated reason stays valid for the next request
REASON_MAX_CHARS = 500


class OperatorReason:
    def __init__(self, max_age_s: float = REASON_MAX_AGE_S):
        self.max_age_s = max_age_s
        self._text: str | None = None
        self._stated_at = -math.inf

    def state(self, text: str, now: float) -> None:
        """A reason arrived at `now` (monotonic s); blank text withdraws the previous one."""
        text = " ".join(str(text).split())[:REASON_MAX_CHARS]
        self._text, self._stated_at = (text or None), now

    def take(self, now: float) -> str | None:
        """The reason for a request at `now`, consumed; None when none is fresh."""
        text, age = self._text, now - self._stated_at
        if text is None or not 0.0 <= age <= self.max_age_s:
            return None
        self._text = None
        return text
