"""What a direct arm driver (franky/libfranka, ur_rtde) needs besides the SDK, as pure logic.

- `ArmCommand`: the desired arm motion from ros2_control-style commands (a JTC trajectory, a
  forward position command, or hold), sampled at the driver's streaming rate. Same semantics as
  the simulated and the real controllers: a trajectory starts from the current setpoint, stamp 0
  means now, a rejected command freezes the setpoint where it is. `stream_sample` is what a
  driver streaming targets ahead of now takes from it.
- `classify_libfranka_error`: which libfranka failure a ControlException message reports.
- `Reconnector`: back-off state machine for re-establishing a lost robot connection.

When a desired gripper width becomes a gripper call is core/gripper_intent.py's decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.gripper import opening_from_width, width_from_opening
from vla_runtime.core.trajectory import (
    TrajectoryRejected,
    TrajectorySampler,
    column_order,
    validate_trajectory,
)

STREAM_GAP_S = 0.05  # forward commands closer than this form a stream (a gate sends 4 ms apart)


@dataclass(frozen=True)
class StreamSample:
    tracking: bool  # whether the arm is meant to follow the setpoint now (`ArmCommand.tracking`)
    desired: np.ndarray  # arm positions desired now
    target: np.ndarray  # arm positions desired `lookahead` s from now
    target_velocity: np.ndarray
    desired_width: float | None  # a gripper width a trajectory asked for since the last sample


class ArmCommand:
    """Desired arm positions/velocities over time; the finger joint (if any) is optional in
    trajectories and yields a desired gripper width (both fingers)."""

    def __init__(
        self,
        joints: Sequence[str],
        lower: Sequence[float],
        upper: Sequence[float],
        start: Sequence[float],
        finger_joint: str | None = None,
        max_width: float = 0.0,
    ):
        self.joints = tuple(joints)
        self.dof = len(self.joints)
        self._finger = (finger_joint,) if finger_joint else ()
        self._lower = (*lower, *([0.0] if finger_joint else []))
        self._upper = (*upper, *([opening_from_width(max_width)] if finger_joint else []))
        self._arm_lower, self._arm_upper = np.asarray(lower, float), np.asarray(upper, float)
        self._sampler: TrajectorySampler | None = None
        self._with_finger = False
        self._hold = np.asarray(start, dtype=float).copy()
        self.desired_width: float | None = None  # last width asked through a trajectory
        self._forward_times = (-math.inf, -math.inf)  # the last two accepted forward commands

    @property
    def trajectory_active(self) -> bool:
        return self._sampler is not None

    def sample(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Desired arm positions and velocities at time t (s); finger width updated on the way."""
        if self._sampler is None:
            return self._hold, np.zeros(self.dof)
        p, v, _ = self._sampler.sample(t)
        if self._with_finger:
            self.desired_width = width_from_opening(float(p[-1]))
        if self._sampler.done(t):
            self._hold = p[: self.dof].copy()
            self._sampler = None
            return self._hold, np.zeros(self.dof)
        return p[: self.dof], v[: self.dof]

    def hold(self, positions: Sequence[float]) -> None:
        """Stop any trajectory and hold `positions` (e.g. the measured state after an error)."""
        self._sampler = None
        self._hold = np.asarray(positions, dtype=float)[: self.dof].copy()

    def set_trajectory(
        self,
        names: Sequence[str],
        positions: Sequence[Sequence[float]],
        times: Sequence[float],
        velocities=None,
        accelerations=None,
        start_time: float = 0.0,
        now: float = 0.0,
    ) -> str | None:
        """Follow a JointTrajectory; returns None when accepted, else the reason (and holds)."""
        current_p, current_v = self.sample(now)
        current_p = current_p.copy()
        reason = validate_trajectory(
            names, positions, velocities, accelerations, times,
            self.joints, self._finger, self._lower, self._upper,
        )  # fmt: skip
        if reason is not None:
            self.hold(current_p)
            return reason
        order = (*self.joints, *self._finger)
        cols = column_order(names, order)
        with_finger = len(cols) > self.dof

        def reorder(rows):
            if not rows:
                return None
            return [[row[c] for c in cols] if len(row) else () for row in rows]

        start_p, start_v = current_p, current_v
        if with_finger:
            width = self.desired_width
            opening = self._upper[-1] if width is None else opening_from_width(width)
            start_p, start_v = np.append(start_p, opening), np.append(start_v, 0.0)
        start = now if start_time == 0.0 else float(start_time)
        if start > now:  # the setpoint holds still until the trajectory begins
            start_v = np.zeros_like(start_v)
        try:
            sampler = TrajectorySampler(
                start, start_p, list(times), np.asarray(positions, dtype=float)[:, cols],
                reorder(velocities), reorder(accelerations), start_velocities=start_v, now=now,
            )  # fmt: skip
        except TrajectoryRejected as exc:
            self.hold(current_p)
            return str(exc)
        self._sampler, self._with_finger = sampler, with_finger
        return None

    def set_positions(self, positions: Sequence[float], now: float = 0.0) -> str | None:
        """Forward position command: one position per arm joint, held until the next one."""
        values = [float(v) for v in positions]
        reason = None
        if len(values) != self.dof:
            reason = f"{len(values)} positions for {self.dof} arm joints"
        elif not all(math.isfinite(v) for v in values):
            reason = f"non-finite positions {values}"
        else:
            outside = [
                f"{name} = {v} outside [{lo}, {hi}]"
                for name, v, lo, hi in zip(
                    self.joints, values, self._arm_lower, self._arm_upper, strict=True
                )
                if not lo <= v <= hi
            ]
            reason = outside[0] if outside else None
        if reason is not None:
            self.hold(self.sample(now)[0].copy())
            return reason
        self.hold(values)
        self._forward_times = (self._forward_times[1], now)
        return None

    def stream_sample(self, now: float, lookahead: float) -> StreamSample:
        """The setpoint now and the target `lookahead` s ahead (copies), sampled in that order:
        sampling ahead may finish the trajectory. The desired width is handed over once."""
        tracking = self.tracking(now)
        desired = self.sample(now)[0].copy()
        target, velocity = self.sample(now + lookahead)
        width, self.desired_width = self.desired_width, None
        return StreamSample(tracking, desired, target.copy(), velocity.copy(), width)

    def tracking(self, now: float, max_gap: float = STREAM_GAP_S) -> bool:
        """Whether the setpoint is one the arm is meant to be following now: a trajectory, or a
        forward position *stream* (the last two commands, and now, within `max_gap`). A lone
        forward command is a step, whose "tracking error" would only be the step itself."""
        if self.trajectory_active:
            return True
        previous, last = self._forward_times
        return last - previous <= max_gap and now - last <= max_gap


LIBFRANKA_ERROR_KINDS = (
    "discontinuity",
    "communication_constraints_violation",
    "reflex",
    "limit_violation",
    "other",
)


def classify_libfranka_error(message: str) -> str:
    """Map a libfranka ControlException message to one of LIBFRANKA_ERROR_KINDS.

    libfranka names the failed checks in the message, e.g. "control_command_success_rate:
    communication_constraints_violation" or "joint_motion_generator_position_discontinuity".
    """
    text = message.lower()
    if "discontinuity" in text:
        return "discontinuity"
    if "communication_constraints_violation" in text or "success_rate" in text:
        return "communication_constraints_violation"
    if "reflex" in text or "collision" in text:
        return "reflex"
    if "limits_violation" in text or "limit_violation" in text:
        return "limit_violation"
    return "other"


@dataclass
class Reconnector:
    """Exponential back-off for reconnecting to a robot controller.

    States: "connected", "waiting" (a retry is due at `retry_at`), "failed" (gave up after
    `max_attempts` consecutive failures; needs `reset()`, e.g. an operator action). Times are
    whatever monotonic clock the caller uses.
    """

    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_attempts: int = 10
    state: str = "connected"
    attempts: int = 0
    retry_at: float = 0.0

    def lost(self, now: float) -> None:
        """The connection failed (or a connect attempt failed)."""
        self.attempts += 1
        if self.attempts >= self.max_attempts:
            self.state = "failed"
            return
        delay = min(self.max_delay, self.initial_delay * 2 ** (self.attempts - 1))
        self.state, self.retry_at = "waiting", now + delay

    def should_try(self, now: float) -> bool:
        return self.state == "waiting" and now >= self.retry_at

    def connected(self) -> None:
        self.state, self.attempts = "connected", 0

    def reset(self, now: float) -> None:
        """Leave "failed": try again at once."""
        self.attempts, self.state, self.retry_at = 0, "waiting", now
