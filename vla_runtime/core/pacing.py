"""Pacing a fixed-step simulation against wall time, pure logic (no ROS, no MuJoCo).

- `StepGrid`: streams published every so many physics steps (clock, joint states, scene
  state), so every stamp sits exactly on the sim-time grid.
- `WallPacer`: how many steps are due to keep sim time at wall time x the real-time factor.
- `RtfMeter`: the real-time factor achieved over windows of wall time, and when it lags the
  asked one enough to say so.
"""

from __future__ import annotations

import math

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
