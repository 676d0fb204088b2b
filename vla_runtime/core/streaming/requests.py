"""Inference requests in flight: ids, the one answer the streamer waits for, giving up on it
(overdue, timeout, or the safety node refused the answer), and the delay each answer measures in
executed control steps (core/delay.py).

An answer is overdue once it has been waited for longer than the slowest of the last
`LATENCY_WINDOW` answers by OVERDUE_FACTOR plus OVERDUE_SLACK_S: the engine's usual latency is
known, so a lost or hung answer shows within tens of milliseconds instead of after the
request timeout. Until `warmup` answers have been timed the request timeout alone applies."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from vla_runtime.core.delay import DelayEstimator

LATENCY_WINDOW = 20  # answers whose wait sets the overdue threshold
OVERDUE_FACTOR = 1.25
OVERDUE_SLACK_S = 0.03  # s: scheduling noise on a loaded host beyond the slowest recent answer
LATE_COUNTS = 2.0


@dataclass(frozen=True)
class Overdue:
    """A request given up because its answer took longer than the engine's usual latency."""

    request_id: int
    waited_s: float
    expected_s: float


class RequestTracker:
    def __init__(self, warmup: int, timeout_s: float):
        self.delay = DelayEstimator(warmup=warmup)
        self.timeout_s = timeout_s
        self.sent = 0
        self.timed_out = 0
        self.refused = 0
        self.refused_in_a_row = 0  # answers refused since the last one that arrived
        self.overdue = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)  # s, sent -> answered
        self._warmup = warmup
        # Requests given up as overdue, by id -> (sent at, the threshold then): a late answer
        # within LATE_COUNTS x that threshold still times the engine, so that the threshold
        # follows an engine that has become slower instead of halting every request; a far
        # later one (a lost or held-back answer) is an outlier that would blunt the watchdog.
        self._given_up: dict[int, tuple[float, float]] = {}
        self._next_id = 1
        self._pending: tuple[int, float] | None = None  # (request id, sent at)

    @property
    def pending(self) -> int | None:
        return None if self._pending is None else self._pending[0]

    def send(self, now: float, step: int) -> int:
        """Register a request going out at `now`, control step `step`; returns its id."""
        request_id = self._next_id
        self._next_id += 1
        self._pending = (request_id, now)
        self.delay.sent(request_id, step)
        self.sent += 1
        return request_id

    def overdue_after_s(self) -> float:
        """How long an answer may take before it counts as overdue (at most the timeout)."""
        if len(self.latencies) < max(self._warmup, 1):
            return self.timeout_s
        return min(self.timeout_s, OVERDUE_FACTOR * max(self.latencies) + OVERDUE_SLACK_S)

    def expire(self, now: float) -> Overdue | None:
        """Give up the pending request when its answer is overdue at `now` (not yet timed out:
        `awaiting` counts those); returns what was given up."""
        if self._pending is None:
            return None
        request_id, sent_at = self._pending
        waited, limit = now - sent_at, self.overdue_after_s()
        if waited <= limit or limit >= self.timeout_s:
            return None
        self.delay.forget(request_id)
        self._pending = None
        self.overdue += 1
        self._given_up[request_id] = (sent_at, limit)
        while len(self._given_up) > LATENCY_WINDOW:
            self._given_up.pop(next(iter(self._given_up)))
        return Overdue(request_id, waited, limit)

    def awaiting(self, now: float) -> bool:
        """Whether an answer is still expected at `now`; a request pending for longer than
        `timeout_s` is given up (counted as timed out)."""
        if self._pending is None:
            return False
        request_id, sent_at = self._pending
        if now - sent_at <= self.timeout_s:
            return True
        self.delay.forget(request_id)
        self._pending = None
        self.timed_out += 1
        return False

    def answered(self, request_id: int | None, step: int, now: float | None = None) -> int | None:
        """A chunk carrying `request_id` arrived at control step `step`; returns the delay in
        steps it measures, if any (`now` also times the answer). The pending request is
        answered by a chunk carrying its id, or by one without any id (an engine that answers
        each request once but does not echo ids)."""
        late = self._given_up.pop(request_id, None) if request_id is not None else None
        if late is not None and now is not None and 0.0 <= now - late[0] <= LATE_COUNTS * late[1]:
            self.latencies.append(now - late[0])
        if self._pending is None:
            return None
        pending_id = self._pending[0]
        if request_id is not None and request_id != pending_id:
            return self.delay.answered(request_id, step)  # late answer: no-op
        if now is not None and now >= self._pending[1]:
            self.latencies.append(now - self._pending[1])
        self._pending = None
        self.refused_in_a_row = 0
        return self.delay.answered(pending_id, step)

    def refuse(self, request_id: int) -> bool:
        """The answer to `request_id` will not come; returns whether it was the pending one."""
        if self._pending is None or self._pending[0] != request_id:
            return False
        self._pending = None
        self.delay.forget(request_id)
        self.refused += 1
        self.refused_in_a_row += 1
        return True
