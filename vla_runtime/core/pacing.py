"""Pacing a fixed-step simulation against wall time (no ROS, no MuJoCo).

- `PhysicsLoop`: the physics thread's loop, lock-step (advancing only the steps asked for) or
  free-running, publishing each stream on its step.
- `StepGrid`: streams published every so many physics steps (clock, joint states, scene
  state), so every stamp sits exactly on the sim-time grid.
- `WallPacer`: how many steps are due to keep sim time at wall time x the real-time factor.
- `RtfMeter`: the real-time factor achieved over windows of wall time, and when it lags the
  asked one enough to say so.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

# When physics falls this far behind wall time x RTF (a loaded machine), it stops trying to
# catch up and rebases, so it never bursts through seconds of backlog.
MAX_LAG_S = 0.25
RTF_WINDOW_S = 2.0  # wall seconds over which the achieved real-time factor is measured
FAST_BATCH_STEPS = 10  # steps per batch when running as fast as possible (factor 0)


class StepGrid:
    """Publication periods in physics steps of streams given by their rates."""

    def __init__(self, rates: dict[str, float], steps_per_s: int):
        """`rates`: {name: Hz of sim time}, each in (0, steps_per_s]."""
        periods = []
        for name, rate in rates.items():
            if not 0.0 < rate <= steps_per_s:
                raise ValueError(f"{name} must be in (0, {steps_per_s}], got {rate}")
            periods.append(max(1, round(steps_per_s / rate)))
        self.periods = tuple(periods)

    def due(self, steps: int) -> tuple[bool, ...]:
        """Per stream, in the order of `rates`: whether step `steps` is on its grid."""
        return tuple(steps % p == 0 for p in self.periods)

    def steps_to_next(self, steps: int) -> int:
        """Steps from step `steps` to the next publication of any stream (at least 1)."""
        return min(p - steps % p for p in self.periods)


class WallPacer:
    """Steps due at a wall time to keep sim time at (wall time - wall0) x rtf + sim0; rtf 0 runs
    as fast as possible."""

    def __init__(self, dt: float, rtf: float, wall0: float, sim0: float, max_lag_s=MAX_LAG_S):
        self.dt, self.rtf = dt, rtf
        self._batch_cap = max(1, round(max_lag_s / dt))
        self._wall0, self._sim0 = wall0, sim0

    @property
    def idle_s(self) -> float:
        """How long to wait when no step is due: one step of wall time."""
        return self.dt / self.rtf

    def due(self, now: float, sim_time: float) -> int:
        """Steps to take at wall time `now` with the simulation at `sim_time` (0: none yet)."""
        if self.rtf <= 0.0:
            return FAST_BATCH_STEPS
        due = round((self._sim0 + (now - self._wall0) * self.rtf - sim_time) / self.dt)
        if due > self._batch_cap:  # too far behind: rebase instead of bursting
            self._wall0, self._sim0 = now, sim_time
            return self._batch_cap
        return max(due, 0)


class RtfMeter:
    """The real-time factor achieved over each window of `window_s` wall seconds; it lags when
    below 90 % of the asked `rtf`, said at most every `warn_every_s`."""

    def __init__(
        self, rtf: float, wall0: float, sim0: float, window_s=RTF_WINDOW_S, warn_every_s=30.0
    ):
        self.rtf = rtf
        self.achieved = math.nan
        self._wall, self._sim = wall0, sim0
        self._window_s, self._warn_every_s = window_s, warn_every_s
        self._warned_at = 0.0

    def update(self, now: float, sim_time: float) -> bool:
        """Measure at wall time `now`; True when a lag warning is due."""
        if now - self._wall < self._window_s:
            return False
        self.achieved = (sim_time - self._sim) / (now - self._wall)
        self._wall, self._sim = now, sim_time
        lagging = self.rtf > 0 and self.achieved < 0.9 * self.rtf
        if lagging and now - self._warned_at > self._warn_every_s:
            self._warned_at = now
            return True
        return False


class PhysicsLoop:
    """Runs a fixed-step simulation in the calling thread (`run`) until `stop`: lock-step,
    advancing only the steps asked for (`request`), or free-running at wall time x rtf. After
    each step on a stream's grid it calls `publish(*grid.due(steps))`; a lock-step batch ends
    with the streams not just published, so all of them show its final time."""

    def __init__(
        self,
        grid: StepGrid,
        dt: float,
        rtf: float,
        lockstep: bool,
        step: Callable[[int], None],
        sim_time: Callable[[], float],
        publish: Callable[..., None],
        warn: Callable[[str], None],
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.grid, self.dt, self.rtf, self.lockstep = grid, dt, rtf, lockstep
        self._step, self._sim_time, self._publish, self._warn = step, sim_time, publish, warn
        self._clock, self._sleep = clock, sleep
        self._wake = threading.Condition()
        self._pending = 0
        self.running = True
        self.steps = 0
        self.achieved_rtf = math.nan

    def run(self) -> None:
        if self.lockstep:
            self._lockstep_loop()
        else:
            self._free_loop()

    def request(self, n: int) -> bool:
        """Lock-step: advance `n` more steps; 0 publishes every stream again now, in the caller's
        thread (what was published at start is lost when it went out before the requester's
        subscriptions had matched). False, doing nothing, when free-running."""
        if not self.lockstep:
            return False
        if n == 0:
            self._publish(*(True for _ in self.grid.periods))
            return True
        with self._wake:
            self._pending += n
            self._wake.notify()
        return True

    def stop(self) -> None:
        with self._wake:
            self.running = False
            self._wake.notify_all()

    def _lockstep_loop(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._pending > 0 or not self.running)
                if not self.running:
                    return
                n, self._pending = self._pending, 0
            self._advance(n)
            self._publish(*(not due for due in self.grid.due(self.steps)))

    def _free_loop(self) -> None:
        now, t = self._clock(), self._sim_time()
        pacer, meter = WallPacer(self.dt, self.rtf, now, t), RtfMeter(self.rtf, now, t)
        while self.running:
            now = self._clock()
            due = pacer.due(now, self._sim_time())
            if due == 0:
                # Nothing outside sees a step before the next publication: sleep until it is
                # due and take the steps in one batch (a wake-up per 1 ms step costs the node's
                # executor thread the GIL a thousand times a second).
                self._sleep(pacer.idle_s * self.grid.steps_to_next(self.steps))
                continue
            self._advance(due)
            lagging = meter.update(now, self._sim_time())
            self.achieved_rtf = meter.achieved
            if lagging:
                self._warn(
                    f"physics runs at {self.achieved_rtf:.2f}x real time "
                    f"(asked {self.rtf:g}x): the machine is too loaded"
                )

    def _advance(self, n: int) -> None:
        while n > 0 and self.running:
            k = min(n, self.grid.steps_to_next(self.steps))
            self._step(k)
            self.steps += k
            n -= k
            due = self.grid.due(self.steps)
            if any(due):
                self._publish(*due)
