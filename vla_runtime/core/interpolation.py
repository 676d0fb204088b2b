"""Jerk-limited tracking of a reference to the control rate (ruckig, community edition).

Each control tick asks ruckig for the time-optimal jerk-limited motion from the current command
state to the reference state (position, velocity, acceleration) at the next command time, with a
minimum duration of one tick, and takes its state after one tick. When the reference is
reachable within the limits that state is the reference itself (exact tracking); when it is not,
the command lags and catches up at the limits instead of jumping. `brake` is the hold
behaviour: velocity control to zero, so the command decelerates within the limits and stops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ruckig import ControlInterface, InputParameter, Result, Ruckig, RuckigError, Trajectory

from vla_runtime.core.gripper import max_finger_speed
from vla_runtime.core.robot import RobotConfig

# The robot files give no derivative limits for the gripper finger; these reach the finger's
# maximum speed in 0.05 s and full acceleration in 0.025 s, gentle for a parallel gripper.
GRIPPER_ACCELERATION_PER_SPEED = 20.0  # 1/s
GRIPPER_JERK_PER_ACCELERATION = 40.0  # 1/s
# Targets are kept a little inside the limits: ruckig rejects a target state whose velocity plus
# the velocity gained while ramping its acceleration down would exceed max_velocity.
TARGET_FRACTION = 0.98
# Look-ahead, in control ticks, at which a lagging command aims to be back on the reference.
MAX_REJOIN_TICKS = 256


@dataclass(frozen=True)
class Limits:
    """Per-joint velocity / acceleration / jerk limits, in the streamer's column order."""

    velocity: np.ndarray
    acceleration: np.ndarray
    jerk: np.ndarray

    @property
    def dof(self) -> int:
        return len(self.velocity)


def limits_for(robot: RobotConfig, with_gripper: bool = True, fraction: float = 1.0) -> Limits:
    """The robot's arm limits (velocity and acceleration times `fraction`), plus one finger
    column (the chunks' gripper column)."""
    velocity = [fraction * v for v in robot.velocity]
    acceleration = [fraction * a for a in robot.acceleration]
    jerk = list(robot.jerk)
    if with_gripper:
        finger_speed = max_finger_speed(robot) or 0.05
        finger_acceleration = finger_speed * GRIPPER_ACCELERATION_PER_SPEED
        velocity.append(finger_speed)
        acceleration.append(finger_acceleration)
        jerk.append(finger_acceleration * GRIPPER_JERK_PER_ACCELERATION)
    return Limits(np.array(velocity), np.array(acceleration), np.array(jerk))


@dataclass
class MotionState:
    position: np.ndarray
    velocity: np.ndarray
    acceleration: np.ndarray

    @classmethod
    def at_rest(cls, position) -> MotionState:
        position = np.array(position, dtype=float)
        return cls(position, np.zeros_like(position), np.zeros_like(position))

    def copy(self) -> MotionState:
        return MotionState(self.position.copy(), self.velocity.copy(), self.acceleration.copy())


class JerkLimitedTracker:
    """Steps a command state towards a moving reference or to a stop, within `limits`."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.failures = 0  # ruckig errors (each one answered by braking for that tick)
        n = limits.dof
        self._ruckig = Ruckig(n)
        self._input = InputParameter(n)
        self._trajectory = Trajectory(n)
        self._input.max_velocity = limits.velocity.tolist()
        self._input.max_acceleration = limits.acceleration.tolist()
        self._input.max_jerk = limits.jerk.tolist()
        self._velocity_cap = limits.velocity * TARGET_FRACTION
        self._acceleration_cap = limits.acceleration * TARGET_FRACTION

    def track(self, state: MotionState, reference, t: float, dt: float, t_end=None) -> MotionState:
        """The command state `dt` seconds later (at time t + dt), following `reference(time) ->
        (position, velocity, acceleration)`.

        First try to be on the reference after one tick. When that is beyond the limits, aim to
        rejoin it 2, 4, 8, ... ticks ahead instead, and take the first tick of the earliest
        rejoining motion that ruckig can fit in time: chasing the next tick's target with a
        time-optimal motion would overshoot and oscillate around a moving reference.
        `t_end` (the reference's last time) caps the look-ahead: nothing beyond it is
        extrapolated."""
        last_ticks = MAX_REJOIN_TICKS
        if t_end is not None:  # never look beyond the reference's end
            last_ticks = max(1, min(last_ticks, math.floor((t_end - t) / dt + 1e-9)))

        def fits(ticks: int) -> bool | None:
            """Can ruckig be on the reference `ticks` ticks ahead? None on a ruckig error
            (rare numerical failures of its synchronisation step)."""
            horizon = ticks * dt
            p, v, a = reference(t + horizon)
            if not self._plan(state, p, v, a, horizon):
                return None
            return self._trajectory.duration <= horizon + 1e-9

        # Exponential search for a horizon at which the reference can be rejoined, then
        # bisection for the earliest one (the fastest catch-up that does not overshoot).
        low, high = 0, 1
        result = fits(high)
        while not result and high < last_ticks:
            low, high = high, min(2 * high, last_ticks)
            result = fits(high)
        if result is None:
            self.failures += 1
            return self.brake(state, dt)
        if result and high - low > 1:
            while high - low > 1:
                middle = (low + high) // 2
                if fits(middle):
                    high = middle
                else:
                    low = middle
            fits(high)  # leave the chosen motion in self._trajectory
        return self._sample(dt)

    def _plan(self, state, position, velocity, acceleration, duration) -> bool:
        inp = self._input
        self._set_current(state)
        inp.control_interface = ControlInterface.Position
        inp.target_position = position.tolist()
        inp.target_velocity = np.clip(velocity, -self._velocity_cap, self._velocity_cap).tolist()
        inp.target_acceleration = np.clip(
            acceleration, -self._acceleration_cap, self._acceleration_cap
        ).tolist()
        inp.minimum_duration = duration
        return self._calculate()

    def _calculate(self) -> bool:
        try:
            result = self._ruckig.calculate(self._input, self._trajectory)
        except RuckigError:  # raised on rare internal numerical failures
            return False
        return result in (Result.Working, Result.Finished)

    def brake(self, state: MotionState, dt: float) -> MotionState:
        """The command state `dt` seconds into a jerk-limited stop (never an extrapolation)."""
        inp = self._input
        self._set_current(state)
        inp.control_interface = ControlInterface.Velocity
        zeros = [0.0] * self.limits.dof
        inp.target_velocity = zeros
        inp.target_acceleration = zeros
        inp.minimum_duration = None
        if not self._calculate():
            self.failures += 1
            return MotionState.at_rest(state.position)
        return self._sample(min(dt, self._trajectory.duration))

    def _set_current(self, state: MotionState) -> None:
        # A state that ruckig produced may sit a rounding error beyond a limit; clip it back.
        inp = self._input
        inp.current_position = state.position.tolist()
        inp.current_velocity = np.clip(
            state.velocity, -self.limits.velocity, self.limits.velocity
        ).tolist()
        inp.current_acceleration = np.clip(
            state.acceleration, -self.limits.acceleration, self.limits.acceleration
        ).tolist()

    def _sample(self, t: float) -> MotionState:
        p, v, a = self._trajectory.at_time(t)
        return MotionState(np.array(p), np.array(v), np.array(a))
