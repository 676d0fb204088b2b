"""Joint velocity / acceleration limit checks of commanded motion, like a robot's reflexes.

A real FR3 (libfranka) aborts a command whose motion exceeds the joint limits with a
`joint_velocity_violation` / `joint_acceleration_violation` reflex and stays stopped until error
recovery; a UR arm goes into a protective stop. The simulator uses these pure checks (no ROS, no
MuJoCo) on what each command interface would make the arm do:

- trajectories: velocities and accelerations of the setpoint sampled over the trajectory's span;
- forward position streams (positions without stamps): the velocity implied by each step over
  an effective interval (`ForwardStream`), robust to DDS jitter and to a loaded simulation
  bunching or spreading arrivals.

Values within `TOLERANCE` (relative) above a limit pass: numerical noise is not a violation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TOLERANCE = 0.01  # relative slack over a limit before it counts as violated
# Forward position streams (see ForwardStream).
STREAM_GAP_S = 0.1  # a command after a longer pause starts a new stream
FIRST_STEP_DT_S = 0.02  # interval a stream's first step is judged over
MAX_DT_S = 0.02  # a step is never judged over a longer interval than this
GAP_FACTOR = 5.0  # ... nor over more than this many typical (median) intervals
INTERVAL_WINDOW = 16  # recent intervals the typical interval is the median of
MIN_INTERVALS = 4  # intervals a stream needs before its typical interval counts


@dataclass(frozen=True)
class Violation:
    """The worst limit violation: `value` (absolute) on `joint` against `limit`."""

    quantity: str  # "velocity" or "acceleration"
    joint: str
    value: float
    limit: float

    @property
    def unit(self) -> str:
        return "rad/s" if self.quantity == "velocity" else "rad/s^2"

    def reason(self, robot_name: str) -> str:
        """The reflex as the robot would name it: libfranka's error for Franka arms
        ("joint_velocity_violation: fr3_joint2 3.00 rad/s > 2.62 (limit)"), a protective stop
        for Universal Robots arms."""
        numbers = f"{self.value:.2f} {self.unit} > {self.limit:.2f} (limit)"
        if robot_name.lower().startswith("ur"):
            return f"protective_stop: {self.joint} {self.quantity} {numbers}"
        return f"joint_{self.quantity}_violation: {self.joint} {numbers}"


def worst_violation(
    quantity: str,
    joints: Sequence[str],
    values,
    limits: Sequence[float],
    tolerance: float = TOLERANCE,
) -> Violation | None:
    """The joint whose |value| exceeds its limit x (1 + tolerance) by the largest ratio, or None.

    `values` holds one row per sample (or a single row) with one column per joint."""
    values = np.abs(np.atleast_2d(np.asarray(values, dtype=float)))
    if values.size == 0:
        return None
    limits = np.asarray(limits, dtype=float)
    if values.shape[1] != limits.shape[0] or len(joints) != limits.shape[0]:
        raise ValueError(f"{values.shape[1]} columns for {limits.shape[0]} limits")
    peak = values.max(axis=0)
    ratio = peak / limits
    worst = int(np.argmax(ratio))
    if ratio[worst] <= 1.0 + tolerance:  # (a NaN is argmax's pick and fails this: violated)
        return None
    return Violation(quantity, joints[worst], float(peak[worst]), float(limits[worst]))


def trajectory_violation(
    joints: Sequence[str],
    sample_times,
    positions,
    velocities,
    accelerations,
    start_positions,
    start_time: float,
    velocity_limits: Sequence[float],
    acceleration_limits: Sequence[float],
    tolerance: float = TOLERANCE,
) -> Violation | None:
    """The worst violation of a setpoint trajectory sampled at increasing `sample_times`.

    `positions`/`velocities`/`accelerations` are its (samples x joints) values and derivatives
    there; `start_positions` is the setpoint at `start_time` (before the first sample). Velocity
    is judged on the derivative and on the finite differences of the positions from the start,
    which catch a setpoint jump (e.g. a trajectory whose start lies in the past, taking the
    setpoint part way along at once). Acceleration is judged on the derivative only: where a
    trajectory's points carry positions only, the controller interpolates linearly and the
    velocity steps at each point, as it does on a real JointTrajectoryController; that step is
    the interpolation's, not a demanded acceleration.
    """
    times = np.concatenate(([start_time], np.asarray(sample_times, dtype=float)))
    path = np.vstack((np.asarray(start_positions, dtype=float), np.asarray(positions, float)))
    dt = np.diff(times)
    steps = np.diff(path, axis=0)
    keep = dt > 0.0
    mean_velocity = steps[keep] / dt[keep, None]
    return worst_violation(
        "velocity",
        joints,
        np.vstack((np.atleast_2d(velocities), mean_velocity)),
        velocity_limits,
        tolerance,
    ) or worst_violation("acceleration", joints, accelerations, acceleration_limits, tolerance)


def effective_dt(interval: float, recent_intervals: Sequence[float]) -> float:
    """The interval a forward step that came `interval` after the previous one is judged over.

    Arrival times jitter (DDS, a loaded machine): two commands bunched together would fake a
    high velocity and one after a long gap would hide a jump. So the interval is clamped to
    [median of the recent intervals, min(GAP_FACTOR x that median, MAX_DT_S)]; the upper bound
    wins when a stream is slower than 1 / MAX_DT_S (a step is then a jump of the setpoint).
    """
    if len(recent_intervals) == 0:
        return min(interval, MAX_DT_S)
    typical = float(np.median(recent_intervals))
    upper = min(GAP_FACTOR * typical, MAX_DT_S)
    return min(max(interval, typical), upper)


class ForwardStream:
    """Arrival timing of a forward position stream (positions without stamps), and the step of
    the setpoint each command is judged as.

    `judge(now, setpoint)` gives (the positions the step starts from, the interval to judge it
    over) for a command arriving at `now`; `accepted(now, setpoint)` records an executed one
    (`setpoint`: the setpoint it replaced). A command that starts a new stream (no previous
    command, or none within STREAM_GAP_S) is compared with the setpoint over FIRST_STEP_DT_S,
    and so is every step until the stream's typical interval is known (MIN_INTERVALS of
    them); later ones over `effective_dt` of their arrival interval. Commands that arrive
    within one controller period (`min_dt`) of each other reach the arm as one step, the last
    of them: such a bunch (queued while physics caught up with wall time, or while it was
    paused) is judged from the setpoint before it, over the longer of its first command's
    interval and one typical interval per command (at most MAX_DT_S). The typical interval
    counts a bunch's commands in the time they came in, so bunching never shortens it.
    `reset()` forgets the stream (another interface took over, a reset).
    """

    def __init__(self, min_dt: float = 0.0, window: int = INTERVAL_WINDOW):
        self.min_dt = float(min_dt)
        self._intervals: deque[float] = deque(maxlen=window)  # per command, of ended bunches
        self._last: float | None = None
        # The bunch the last command belongs to: the time since the previous one (None: the
        # stream's first), its commands, the setpoint before it, its first command's interval.
        self._bunch_interval: float | None = None
        self._bunch_size = 0
        self._bunch_start = None
        self._bunch_dt = 0.0

    def judge(self, now: float, setpoint):
        """(start positions, dt) of the step a command arriving at `now` makes."""
        if self._starts_stream(now):
            return setpoint, FIRST_STEP_DT_S
        if self._in_bunch(now):
            dt = self._bunch_dt
            if self._intervals:
                typical = float(np.median(self._intervals))
                dt = max(dt, min((self._bunch_size + 1) * typical, MAX_DT_S))
            return self._bunch_start, max(dt, self.min_dt)
        return setpoint, self._single_dt(now)

    def accepted(self, now: float, setpoint) -> None:
        if self._starts_stream(now):
            self._intervals.clear()
            self._bunch_interval, dt = None, FIRST_STEP_DT_S
        elif self._in_bunch(now):
            self._bunch_size += 1
            self._last = now
            return
        else:
            dt = self._single_dt(now)
            if self._bunch_interval is not None:
                self._intervals.append(self._bunch_interval / self._bunch_size)
            self._bunch_interval = now - self._last
        self._bunch_size, self._bunch_start, self._bunch_dt = 1, setpoint, dt
        self._last = now

    def reset(self) -> None:
        self._intervals.clear()
        self._last = None

    def _starts_stream(self, now: float) -> bool:
        return self._last is None or now - self._last > STREAM_GAP_S

    def _in_bunch(self, now: float) -> bool:
        return now - self._last <= 0.5 * self.min_dt

    def _single_dt(self, now: float) -> float:
        """The interval a command that starts a bunch is judged over."""
        recent = list(self._intervals)
        if self._bunch_interval is not None:  # the bunch it ends
            recent.append(self._bunch_interval / self._bunch_size)
        if len(recent) < MIN_INTERVALS:  # not known yet: judged like the stream's first step
            return FIRST_STEP_DT_S
        actual = now - self._last
        return max(effective_dt(actual, [*recent, actual]), self.min_dt)


def forward_step_violation(
    joints: Sequence[str],
    previous,
    target,
    dt: float,
    velocity_limits: Sequence[float],
    tolerance: float = TOLERANCE,
) -> Violation | None:
    """The worst velocity violation of stepping the setpoint from `previous` to `target` in dt.

    Only velocity: the acceleration of a finite-differenced unstamped stream (a second
    difference over jittery arrival intervals) is too noisy to judge a reflex on."""
    step = np.asarray(target, dtype=float) - np.asarray(previous, dtype=float)
    return worst_violation("velocity", joints, step / dt, velocity_limits, tolerance)
