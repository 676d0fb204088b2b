"""Inference requests in flight: ids, the one answer the streamer waits for, giving up on it
(timeout, or the safety node refused the answer), and the delay each answer measures in
executed control steps (core/delay.py)."""

from __future__ import annotations

from vla_runtime.core.delay import DelayEstimator


class RequestTracker:
    def __init__(self, warmup: int, timeout_s: float):
        self.delay = DelayEstimator(warmup=warmup)
        self.timeout_s = timeout_s
        self.sent = 0
        self.timed_out = 0
        self.refused = 0
        self.refused_in_a_row = 0  # answers refused since the last one that arrived
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

    def answered(self, request_id: int | None, step: int) -> int | None:
        """A chunk carrying `request_id` arrived at control step `step`; returns the delay in
        steps it measures, if any. The pending request is answered by a chunk carrying its id,
        or by one without any id (an engine that answers each request once but does not echo
        ids)."""
        if self._pending is None:
            return None
        pending_id = self._pending[0]
        if request_id is not None and request_id != pending_id:
            return self.delay.answered(request_id, step)  # late answer: no-op
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
