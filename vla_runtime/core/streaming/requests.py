"""Inference requests in flight: ids, the one answer the streamer waits for, giving up on it
(overdue, timeout, the engine failed it, or the safety node refused the answer), and the delay
each answer measures in executed control steps (core/delay.py).

The whole answer (request sent -> checked chunk here) is timed, and so is each stage between the
milestones the nodes report on the way (`milestone`): the engine's chunk left ("engine"), the
safety node has it ("safety"). The answer is overdue when it, or the stage after the last
milestone reached, takes longer than usual (core/overdue.py): a chunk lost or held up between
engine and safety then shows after a usual transit, not after a usual inference plus check.
Until `warmup` answers (or stages) have been timed the request timeout alone applies."""

from __future__ import annotations

from dataclasses import dataclass

from vla_runtime.core.delay import DelayEstimator
from vla_runtime.core.overdue import DURATION_WINDOW, DurationWatch

LATE_COUNTS = 2.0
SENT, ANSWERED = "sent", "answered"
MILESTONES = (SENT, "engine", "safety", ANSWERED)  # in the order an answer passes them


@dataclass(frozen=True)
class Overdue:
    """A request given up because its answer took longer than the engine's usual latency."""

    request_id: int
    waited_s: float
    expected_s: float
    stage: str  # "sent->answered", or the stage after the last milestone, e.g. "engine->safety"


class RequestTracker:
    def __init__(self, warmup: int, timeout_s: float):
        self.delay = DelayEstimator(warmup=warmup)
        self.timeout_s = timeout_s
        self.sent = 0
        self.timed_out = 0
        self.refused = 0
        self.refused_in_a_row = 0  # answers refused since the last one that arrived
        self.overdue = 0
        self.failed = 0  # given up because the engine reported the attempt failed or hung
        self.latencies = DurationWatch(warmup)  # s, sent -> answered
        self._warmup = warmup
        self.stages: dict[tuple[str, str], DurationWatch] = {}  # (from, to) milestone -> s
        # Requests given up as overdue, by id -> (sent at, the threshold then): a late answer
        # within LATE_COUNTS x that threshold still times the engine, so that the threshold
        # follows an engine that has become slower instead of halting every request; a far
        # later one (a lost or held-back answer) is an outlier that would blunt the watchdog.
        self._given_up: dict[int, tuple[float, float]] = {}
        self._next_id = 1
        self._pending: tuple[int, float] | None = None  # (request id, sent at)
        self._reached: list[tuple[str, float]] = []  # the pending answer's milestones, times

    @property
    def pending(self) -> int | None:
        return None if self._pending is None else self._pending[0]

    def send(self, now: float, step: int) -> int:
        """Register a request going out at `now`, control step `step`; returns its id."""
        request_id = self._next_id
        self._next_id += 1
        self._pending = (request_id, now)
        self._reached = [(SENT, now)]
        self.delay.sent(request_id, step)
        self.sent += 1
        return request_id

    def overdue_after_s(self) -> float:
        """How long an answer may take before it counts as overdue (at most the timeout)."""
        limit = self.latencies.limit_s()
        return self.timeout_s if limit is None else min(self.timeout_s, limit)

    def milestone(self, request_id: int | None, name: str, now: float) -> None:
        """The answer to `request_id` reached milestone `name` ("engine", "safety") at `now`."""
        if self._pending is None or request_id != self._pending[0]:
            return
        self._reach(name, now)

    def _reach(self, name: str, now: float) -> None:
        last, since = self._reached[-1]
        if MILESTONES.index(name) <= MILESTONES.index(last) or now < since:
            return
        self.stages.setdefault((last, name), DurationWatch(self._warmup)).append(now - since)
        self._reached.append((name, now))

    def _stage_limit(self) -> tuple[str, float, float] | None:
        """(the stage after the last milestone, its start, its limit), for the first later
        milestone whose stage from there has been timed; None if none has."""
        last, since = self._reached[-1]
        for name in MILESTONES[MILESTONES.index(last) + 1 :]:
            watch = self.stages.get((last, name))
            limit = None if watch is None else watch.limit_s()
            if limit is not None:
                return f"{last}->{name}", since, limit
        return None

    def engine_failed(self, request_id: int | None) -> bool:
        """The engine reports that its attempt at `request_id` failed or hangs: no answer is
        to be waited for. Returns whether that was the pending request."""
        if self._pending is None or request_id != self._pending[0]:
            return False
        self.delay.forget(request_id)
        self._pending = None
        self.failed += 1
        return True

    def expire(self, now: float) -> Overdue | None:
        """Give up the pending request when its answer is overdue at `now` (not yet timed out:
        `awaiting` counts those); returns what was given up."""
        if self._pending is None:
            return None
        request_id, sent_at = self._pending
        waited, limit = now - sent_at, self.overdue_after_s()
        stage = f"{SENT}->{ANSWERED}"
        if waited <= limit or limit >= self.timeout_s:
            found = self._stage_limit()
            if found is None or now - found[1] <= found[2]:
                return None
            stage, waited, limit = found[0], now - found[1], found[2]
        self.delay.forget(request_id)
        self._pending = None
        self.overdue += 1
        self._given_up[request_id] = (sent_at, self.overdue_after_s())
        while len(self._given_up) > DURATION_WINDOW:
            self._given_up.pop(next(iter(self._given_up)))
        return Overdue(request_id, waited, limit, stage)

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
            self._reach(ANSWERED, now)
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
