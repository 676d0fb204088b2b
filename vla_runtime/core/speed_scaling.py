"""Speed scaling (the UR pendant's speed slider) for the action streamer, pure logic without ROS.

Source: Universal_Robots_ROS2_Driver's `speed_scaling_state_broadcaster` publishes std_msgs/Float64
on `/speed_scaling_state_broadcaster/speed_scaling` (100 Hz) in PERCENT, 0..100: its update()
publishes `speed_scaling_factor * 100.0` on humble, jazzy and kilted, although ur_controllers'
README says "between 0 and 1" (the code wins; `speed_scaling_unit` "fraction" exists for
sources that do publish 0..1). The factor is the slider (RTDE target_speed_fraction) times the
controller's own runtime scaling; the driver forces it to 0 while the program is paused or
resuming. `scaled_joint_trajectory_controller`
advances its trajectory time by factor x period each cycle; the streamer does the same with its
plan (`PlanClock`), so the plan and the arm slow down, pause and resume together.
"""

from __future__ import annotations

import bisect
import math

UR_SPEED_SCALING_TOPIC = "/speed_scaling_state_broadcaster/speed_scaling"
UR_SCALED_CONTROLLER = "scaled_joint_trajectory_controller"
# Divisor that turns a reading into a fraction: UR's broadcaster publishes percent.
UNITS = {"percent": 100.0, "fraction": 1.0}
_TOLERANCE = 1e-9  # rounding slack at the ends of [0, 1], clamped without a warning


def broadcast_topic(setting: str, trajectory_controller: str) -> str:
    """Where a simulated arm publishes its speed scaling: `setting`, where that is "auto" UR's
    broadcaster topic for an arm driven through scaled_joint_trajectory_controller (UR's driver
    always runs the broadcaster next to it) and none ("") for any other arm."""
    if setting != "auto":
        return setting
    return UR_SPEED_SCALING_TOPIC if trajectory_controller == UR_SCALED_CONTROLLER else ""


def speed_fraction(reading: float, unit: str = "percent") -> tuple[float | None, str | None]:
    """The speed fraction in [0, 1] for a raw reading, and a warning when the reading was
    clamped or rejected. A non-finite reading is rejected (None: keep the last value); a
    negative one is clamped to 0 (pause, the safe side); above 1 is clamped to 1."""
    if unit not in UNITS:
        raise ValueError(f"speed scaling unit must be one of {sorted(UNITS)}, got {unit!r}")
    value = float(reading)
    if not math.isfinite(value):
        return None, f"speed scaling {value!r} is not finite: ignored, keeping the last value"
    fraction = value / UNITS[unit]
    if fraction < -_TOLERANCE:
        return 0.0, f"speed scaling {value:g} ({unit}) is negative: clamped to 0 (pause)"
    if fraction > 1.0 + _TOLERANCE:
        hint = " (the UR driver publishes percent: speed_scaling_unit percent?)" if (
            unit == "fraction" and value <= 100.0
        ) else ""  # fmt: skip
        return 1.0, f"speed scaling {value:g} ({unit}) is above 100 %: clamped to 1{hint}"
    return min(max(fraction, 0.0), 1.0), None


class SpeedSlider:
    """A simulated arm's pendant speed slider (the sim driver's `speed_scaling` parameter): a
    fraction in [0, 1], published in percent as UR's broadcaster does."""

    def __init__(self, fraction: float):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"speed_scaling must be in [0, 1], got {fraction}")
        self.fraction = fraction

    def set(self, value) -> str | None:
        """Move the slider to `value` at run time; why it stays, or None."""
        if not isinstance(value, float) or not 0.0 <= value <= 1.0:
            return "speed_scaling must be a float in [0, 1]"
        self.fraction = value
        return None

    @property
    def percent(self) -> float:
        return 100.0 * self.fraction


class PlanClock:
    """Plan time tau as a function of time t (ROS time, the streamer's command-time axis):
    d tau / dt = s, the speed fraction in force. Piecewise linear with a breakpoint wherever s
    changed, so a past time (an observation stamp) maps to the plan time the arm was at then.

    Until the first change tau = t exactly (no arithmetic at all), so streaming at full speed
    is bit-for-bit what it was without speed scaling. Breakpoints older than `history_s`
    before the newest one are forgotten: older stamps extrapolate the last forgotten slope
    (chunks that old are stale anyway)."""

    def __init__(self, history_s: float = 30.0):
        self.history_s = history_s
        self._t: list[float] = []  # breakpoint times, increasing
        self._tau: list[float] = []  # plan time at each breakpoint
        self._scale: list[float] = []  # slope from each breakpoint on
        self._slope_before = 1.0  # slope before the oldest breakpoint kept (1: tau = t there)

    @property
    def scale(self) -> float:
        """The speed fraction in force now (1 before any change)."""
        return self._scale[-1] if self._scale else 1.0

    def at(self, t: float) -> float:
        if not self._t:
            return t
        i = bisect.bisect_right(self._t, t) - 1
        if i < 0:
            return self._tau[0] + self._slope_before * (t - self._t[0])
        return self._tau[i] + self._scale[i] * (t - self._t[i])

    def set_scale(self, scale: float, t: float) -> None:
        """From time t on, plan time advances at `scale` x real time. t never goes back: a
        change dated before the newest breakpoint takes effect at that breakpoint."""
        if not 0.0 <= scale <= 1.0:
            raise ValueError(f"speed scale must be in [0, 1], got {scale}")
        if scale == self.scale:
            return
        if self._t and t < self._t[-1]:
            t = self._t[-1]
        tau = self.at(t)
        if self._t and t == self._t[-1]:  # two changes at one instant: the later one wins
            self._tau[-1], self._scale[-1] = tau, scale
        else:
            self._t.append(t)
            self._tau.append(tau)
            self._scale.append(scale)
        self._forget_before(t - self.history_s)

    def _forget_before(self, t: float) -> None:
        keep = max(0, bisect.bisect_right(self._t, t) - 1)  # the segment covering t stays
        if keep:
            self._slope_before = self._scale[keep - 1]
            del self._t[:keep], self._tau[:keep], self._scale[:keep]


class SpeedScalingInput:
    """The latest valid reading of a speed scaling topic, its time and the readings rejected.

    A source that goes silent keeps its last value: the UR driver only stops publishing when its
    controller manager stops, and falling back to 100 % would run the plan ahead of a slowed
    arm, to 0 would freeze it on a DDS hiccup; the reading's `age` shows a stale one."""

    def __init__(self, unit: str = "percent"):
        if unit not in UNITS:
            raise ValueError(f"speed_scaling_unit must be one of {sorted(UNITS)}, got {unit!r}")
        self.unit = unit
        self.fraction: float | None = None  # None: no valid reading yet
        self.read_at: float | None = None
        self.rejected = 0

    def read(self, reading: float, now: float) -> tuple[float | None, str | None, str | None]:
        """Take a reading at `now`: (its fraction, None when rejected; a warning when it was
        clamped or rejected; a note when it is the first or pauses or resumes the plan)."""
        fraction, warning = speed_fraction(reading, self.unit)
        if fraction is None:
            self.rejected += 1
            return None, warning, None
        previous, self.fraction, self.read_at = self.fraction, fraction, now
        note = None
        if previous is None:
            note = f"speed scaling {fraction:.0%}"
        elif (previous == 0.0) != (fraction == 0.0):
            note = (
                "speed scaling 0: plan paused" if fraction == 0.0
                else f"speed scaling {fraction:.0%}: plan resumed"
            )  # fmt: skip
        return fraction, warning, note

    def age(self, now: float) -> float | None:
        """Seconds since the latest valid reading (None before any)."""
        return None if self.read_at is None else now - self.read_at
