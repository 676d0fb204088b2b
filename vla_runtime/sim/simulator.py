"""MuJoCo FR3 with ros2_control-like command interfaces (no ROS): JTC, forward position, gripper.

The arm follows a setpoint through the model's position actuators. The setpoint comes from the
active trajectory (sampled every 1 ms physics step), from the last forward position command, or
is held. A position actuator kp (q_d - q) - kv dq alone lags a moving setpoint by kv/kp (0.1 s
on the FR3) and coasts on for as long after the setpoint stops, where the real arm tracks within
milliseconds; with `SceneConfig.servo_feedforward` the servo is fed the setpoint's velocity as a
robot's joint controller is (the trajectory's, or a forward command's step over its interval,
for that interval). It is off by default: the shipped policies were trained without it.
A rejected command returns its reason and freezes the setpoint where it is, stopping any
trajectory in progress. Not thread-safe: callers serialise access (the driver node holds a lock).

Like the real arm, the simulator refuses motion beyond the robot's joint velocity and
acceleration limits (`core.motion_limits`): a trajectory whose setpoint would move too fast or
accelerate too hard, or a forward position step implying too high a velocity, trips a reflex
(libfranka's `joint_velocity_violation` / `joint_acceleration_violation` on Franka arms, a
`protective_stop` on UR arms). The reflex is latched in `fault`: the arm holds its setpoint and
every arm or gripper command is refused, naming the fault, until `recover()` (or a reset).

The fingers move toward their commanded opening no faster than the gripper's maximum speed
(`gripper.max_speed`), as a real hand's own controller moves them whatever it is sent: a
gripper that closes in a quarter of the real time teaches a policy a grasp no robot performs.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from vla_runtime.core.gripper import (
    command_refusal,
    finger_toward,
    max_finger_speed,
    max_opening,
    opening_from_width,
    width_refusal,
)
from vla_runtime.core.motion_limits import (
    ForwardStream,
    forward_step_violation,
    trajectory_violation,
)
from vla_runtime.core.robot import load_robot
from vla_runtime.core.trajectory import (
    TrajectoryRejected,
    TrajectorySampler,
    column_order,
    validate_trajectory,
)
from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.workcell import (
    GRIPPER_ACTUATOR,
    SERVO_FEEDFORWARD,
    SceneConfig,
    cube_names,
    cube_poses,
    gripper_ctrl_per_opening,
)

MODEL_FINGER_JOINTS = ("finger_joint1", "finger_joint2")


def servo_fed_forward(model: mujoco.MjModel) -> bool:
    """Whether the scene was built with its arm servo fed the setpoint's velocity."""
    try:
        return bool(model.numeric(SERVO_FEEDFORWARD).data[0])
    except KeyError:
        return False


def velocity_lead_s(model: mujoco.MjModel, actuators) -> np.ndarray:
    """kv / kp of position actuators: ctrl = q_d + lead dq_d turns their kp (ctrl - q) - kv dq
    into kp (q_d - q) + kv (dq_d - dq), a servo fed the setpoint's velocity."""
    return -model.actuator_biasprm[actuators, 2] / model.actuator_gainprm[actuators, 0]


SAMPLE_BLOCK = 20_000  # physics steps of a trajectory limit-checked at once


class Simulator:
    def __init__(self, config: SceneConfig = SceneConfig()):
        self.config = config
        self.robot = load_robot(config.robot)
        self.model, self.xml = build_scene(config)
        self.data = mujoco.MjData(self.model)
        self.dt = float(self.model.opt.timestep)
        model = self.model
        arm_qpos = [model.joint(j).qposadr[0] for j in self.robot.joints]
        finger_qpos = [model.joint(j).qposadr[0] for j in MODEL_FINGER_JOINTS]
        # Arm then fingers are the first qpos/qvel entries of the FR3 model; slices keep the hot
        # path cheap, so make sure that layout holds.
        if arm_qpos + finger_qpos != list(range(self.robot.dof + 2)):
            raise RuntimeError(f"unexpected joint layout {arm_qpos + finger_qpos}")
        self._arm = slice(0, self.robot.dof)
        self._joints = slice(0, self.robot.dof + 2)
        self._arm_actuators = slice(0, self.robot.dof)
        self._gripper_actuator = model.actuator(GRIPPER_ACTUATOR).id
        self._ctrl_per_opening = gripper_ctrl_per_opening(model)
        self._finger_step = max_finger_speed(self.robot) * self.dt  # opening per physics step
        lead = velocity_lead_s(model, self._arm_actuators)
        self._velocity_lead_s = lead if config.servo_feedforward else np.zeros_like(lead)
        self._cube_qpos = [model.joint(name).qposadr[0] for name in cube_names(config)]
        self._cube_qvel = [model.joint(name).dofadr[0] for name in cube_names(config)]
        self.max_width = self.robot.gripper_max_width
        self.arm_joint_names = self.robot.joints
        self.joint_names = self.robot.joints + self.robot.gripper_joints
        self._trajectory_joints = (*self.robot.joints, self.robot.gripper_joints[0])
        self._lower = (*self.robot.position_min, 0.0)
        self._upper = (*self.robot.position_max, max_opening(self.robot))
        self._velocity_limits = self.robot.velocity
        self._acceleration_limits = self.robot.acceleration
        self._home_key = model.key("home").id
        self._seed = config.seed
        self.reset()

    # -- state -------------------------------------------------------------------------------
    @property
    def time(self) -> float:
        return self.data.time

    @property
    def arm_positions(self) -> np.ndarray:
        return self.data.qpos[self._arm].copy()

    @property
    def arm_velocities(self) -> np.ndarray:
        return self.data.qvel[self._arm].copy()

    @property
    def finger_positions(self) -> np.ndarray:
        return self.data.qpos[self.robot.dof : self.robot.dof + 2].copy()

    @property
    def finger_velocities(self) -> np.ndarray:
        return self.data.qvel[self.robot.dof : self.robot.dof + 2].copy()

    @property
    def gripper_width(self) -> float:
        return float(self.data.qpos[self.robot.dof] + self.data.qpos[self.robot.dof + 1])

    def joint_state(self) -> tuple[np.ndarray, np.ndarray]:
        """Positions and velocities in `joint_names` order (arm joints, then both fingers)."""
        return self.data.qpos[self._joints].copy(), self.data.qvel[self._joints].copy()

    @property
    def qpos(self) -> np.ndarray:
        """Full generalized positions (arm, fingers, cube free joints) for renderers."""
        return self.data.qpos.copy()

    @property
    def trajectory_active(self) -> bool:
        return self._sampler is not None

    @property
    def setpoint(self) -> np.ndarray:
        """The arm position setpoint now."""
        return self._setpoint_now()[0][self._arm].copy()

    def cube_positions(self) -> dict[str, np.ndarray]:
        return {
            name: self.data.qpos[adr : adr + 3].copy()
            for name, adr in zip(cube_names(self.config), self._cube_qpos, strict=True)
        }

    # -- stepping ----------------------------------------------------------------------------
    def step(self, n: int = 1) -> None:
        """Advance n physics steps of `dt`, updating the setpoint every step while a trajectory
        runs (like a 1 kHz controller manager)."""
        model, data = self.model, self.data
        sampler = self._sampler
        if sampler is None and self._forward_until is not None:
            n = self._run_forward_step(n)
        if sampler is None and self._finger_opening == self._finger_goal:
            mujoco.mj_step(model, data, n)
            return
        ctrl = data.ctrl
        arm = self._arm_actuators
        lead = self._velocity_lead_s
        with_finger = sampler is not None and self._sampler_has_finger
        for _ in range(n):
            if sampler is not None:
                p, v, _ = sampler.sample(data.time + self.dt)
                ctrl[arm] = p[arm] + lead * v[arm]
                if with_finger:
                    self._finger_goal = float(p[-1])
            self._ramp_finger()
            mujoco.mj_step(model, data)
        if sampler is not None and sampler.done(data.time):
            self._freeze(*self._setpoint_now()[:1])

    # -- commands ----------------------------------------------------------------------------
    def set_trajectory(
        self,
        names,
        positions,
        times,
        velocities=None,
        accelerations=None,
        start_time: float = 0.0,
    ) -> str | None:
        """Follow a JointTrajectory (times = time_from_start in s; start_time 0 means now).

        Returns None when accepted, else the reason (and the sim holds). A trajectory whose
        setpoint would exceed the joint velocity or acceleration limits trips the reflex."""
        reason = self.refusal()
        if reason is not None:
            return reason
        reason = validate_trajectory(
            names, positions, velocities, accelerations, times,
            self.robot.joints, self._trajectory_joints[-1:], self._lower, self._upper,
        )  # fmt: skip
        if reason is not None:
            self.hold()
            return reason
        cols = column_order(names, self._trajectory_joints)

        def reorder(rows):
            if not rows:
                return None
            return [[row[c] for c in cols] if len(row) else () for row in rows]

        with_finger = len(cols) > self.robot.dof
        now = self.time
        start = now if start_time == 0.0 else float(start_time)
        p, v, a = self._setpoint_now()
        width = self.robot.dof + 1 if with_finger else self.robot.dof
        p, v, a = p[:width], v[:width], a[:width]
        if start > now:  # the setpoint holds until the trajectory begins
            v, a = np.zeros(width), np.zeros(width)
        try:
            sampler = TrajectorySampler(
                start, p, list(times), np.asarray(positions, dtype=float)[:, cols],
                reorder(velocities), reorder(accelerations),
                start_velocities=v, start_accelerations=a, now=now,
            )  # fmt: skip
        except TrajectoryRejected as exc:
            self.hold()
            return str(exc)
        violation = self._trajectory_violation(sampler, now, p[: self.robot.dof])
        if violation is not None:
            return self._trip(violation.reason(self.robot.name))
        self._sampler = sampler
        self._sampler_has_finger = with_finger
        self._forward.reset()  # the trajectory took over: a later forward command starts anew
        return None

    def set_forward_positions(self, positions) -> str | None:
        """Forward position controller command: one position per arm joint.

        A step implying a velocity beyond the joint limits trips the reflex. The step goes from
        the setpoint now (the previous forward command while a stream runs; for commands that
        arrive in one physics step, the setpoint before the first of them) and is judged over
        `ForwardStream`'s effective interval: the arrival interval in sim time clamped around
        the stream's typical one, or FIRST_STEP_DT_S until that is known."""
        reason = self.refusal()
        if reason is not None:
            return reason
        values = list(positions)
        if len(values) != self.robot.dof:
            reason = f"{len(values)} positions for {self.robot.dof} arm joints"
        elif not all(math.isfinite(v) for v in values):
            reason = f"non-finite positions {values}"
        else:
            reason = next(
                (
                    f"{name} = {v} outside [{lo}, {hi}]"
                    for name, v, lo, hi in zip(
                        self.robot.joints,
                        values,
                        self.robot.position_min,
                        self.robot.position_max,
                        strict=True,
                    )  # fmt: skip
                    if not lo <= v <= hi
                ),
                None,
            )
        if reason is not None:
            self.hold()
            return reason
        target = np.asarray(values, dtype=float)
        now = self.time
        start, dt = self._forward.judge(now, self.setpoint)
        violation = forward_step_violation(
            self.robot.joints, start, target, dt, self._velocity_limits
        )
        if violation is not None:
            step = float(np.abs(target - start).max())
            return self._trip(
                f"{violation.reason(self.robot.name)}; forward step {step:.4f} rad "
                f"judged over {1e3 * dt:.1f} ms"
            )
        self._forward.accepted(now, self.setpoint)
        self._freeze(target)
        # The step's velocity leads the servo for the interval it was judged over (without
        # feedforward there is no lead, and physics runs in whole batches).
        self._forward_until = now + dt if self._velocity_lead_s.any() else None
        self.data.ctrl[self._arm_actuators] = target + self._velocity_lead_s * (target - start) / dt
        return None

    def set_gripper(self, width: float) -> str | None:
        """Gripper width in metres, both fingers (0 closed .. max width): a gripper command."""
        reason = self.refusal()
        if reason is not None:
            return reason
        try:
            width = float(width)
        except (TypeError, ValueError):
            width = math.nan
        reason = width_refusal(width, self.max_width)
        if reason is None:
            self._finger_goal = opening_from_width(width)
            if self._sampler_has_finger:  # a gripper command takes the fingers off the trajectory
                self._sampler_has_finger = False
            return None
        self.hold()
        return reason

    def set_gripper_command(self, values) -> str | None:
        """A gripper controller command's data (one width, m): a malformed one holds the arm,
        refused for the latched fault if there is one."""
        reason = command_refusal(values)
        if reason is None:
            return self.set_gripper(values[0])
        self.hold()
        return self.refusal() or reason

    def hold(self) -> None:
        """Freeze the setpoint where it is now; any trajectory in progress stops."""
        self._freeze(self._setpoint_now()[0])

    def refusal(self) -> str | None:
        """Why any command is refused now: the latched fault (the arm already holds), or None."""
        if self.fault is None:
            return None
        return f"{self.fault} [fault latched: command refused until recovery]"

    def recover(self) -> str | None:
        """Error recovery: clear the latched fault (returned; None when there was none). The arm
        keeps holding; the next forward command starts a new stream."""
        fault, self.fault = self.fault, None
        self._forward.reset()
        return fault

    def randomize(self, seed: int) -> None:
        """Re-place the cubes at the seeded random poses (robot untouched)."""
        self._seed = seed
        self._place_cubes(seed)
        mujoco.mj_forward(self.model, self.data)

    def reset(self, seed: int | None = None) -> None:
        """Home pose, gripper open, time 0, cubes placed by `seed` (default: the last one)."""
        mujoco.mj_resetDataKeyframe(self.model, self.data, self._home_key)
        if seed is not None:
            self._seed = seed
        self._place_cubes(self._seed)
        home = np.array(self.robot.home)  # exact: the keyframe text holds rounded values
        self.data.qpos[self._arm] = home
        self.data.ctrl[self._arm_actuators] = home
        self._sampler: TrajectorySampler | None = None
        self._sampler_has_finger = False
        self._finger_opening = self._finger_goal = float(
            self.data.ctrl[self._gripper_actuator] / self._ctrl_per_opening
        )  # the actuator's target now, and where the hand is moving it
        self._hold_positions = home
        self._forward_until: float | None = None  # a forward command's velocity leads until then
        self.fault: str | None = None  # the latched reflex, until recover() or a reset
        self._forward = ForwardStream(min_dt=self.dt)
        mujoco.mj_forward(self.model, self.data)

    # -- internals ---------------------------------------------------------------------------
    def _run_forward_step(self, n: int) -> int:
        """Step physics while a forward command's velocity still leads the servo (up to `n`
        steps, fingers following), then hold its position; returns the steps left."""
        ahead = max(0, math.ceil((self._forward_until - self.data.time) / self.dt - 1e-9))
        for _ in range(min(n, ahead)):
            self._ramp_finger()
            mujoco.mj_step(self.model, self.data)
        if n >= ahead:
            self._forward_until = None
            self.data.ctrl[self._arm_actuators] = self._hold_positions
        return n - min(n, ahead)

    def _ramp_finger(self) -> None:
        """One physics step of the hand's own controller toward the commanded opening."""
        self._finger_opening = finger_toward(
            self._finger_opening, self._finger_goal, self._finger_step
        )
        self.data.ctrl[self._gripper_actuator] = self._finger_opening * self._ctrl_per_opening

    def _trip(self, reason: str) -> str:
        """Latch the reflex `reason` and stop the arm where its setpoint is."""
        self.fault = reason
        self.hold()
        return reason

    def _trajectory_violation(self, sampler: TrajectorySampler, now: float, start_positions):
        """Worst limit violation of the arm setpoint `sampler` would command from `now` (when
        the setpoint is `start_positions`) to its end, sampled every physics step as `step`
        follows it, or None."""
        dof, dt = self.robot.dof, self.dt
        n = max(1, math.ceil((sampler.end_time - now) / dt - 1e-9))
        previous, since = np.asarray(start_positions, dtype=float), now
        for first in range(0, n + 1, SAMPLE_BLOCK):  # blocks bound the memory of long ones
            times = now + dt * np.arange(first, min(first + SAMPLE_BLOCK, n + 1))
            p, v, a = sampler.sample_many(times)
            moved = times > since  # (the first block's sample at `now` has no step before it)
            violation = trajectory_violation(
                self.robot.joints, times[moved], p[moved, :dof], v[:, :dof], a[:, :dof],
                previous, since, self._velocity_limits, self._acceleration_limits,
            )  # fmt: skip
            if violation is not None:
                return violation
            previous, since = p[-1, :dof], float(times[-1])
        return None

    def _place_cubes(self, seed: int) -> None:
        poses = cube_poses(len(self._cube_qpos), seed, self.config.cube_size)
        for qadr, vadr, (pos, quat) in zip(self._cube_qpos, self._cube_qvel, poses, strict=True):
            self.data.qpos[qadr : qadr + 3] = pos
            self.data.qpos[qadr + 3 : qadr + 7] = quat
            self.data.qvel[vadr : vadr + 6] = 0.0

    def _setpoint_now(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Arm setpoint (plus the finger setpoint as the last entry) and its derivatives now."""
        finger = self._finger_goal  # the hand's own controller moves the fingers toward it
        if self._sampler is not None:
            p, v, a = self._sampler.sample(self.time)
            if self._sampler_has_finger:
                return p.copy(), v.copy(), a.copy()
            return np.append(p, finger), np.append(v, 0.0), np.append(a, 0.0)
        zeros = np.zeros(self.robot.dof + 1)
        return np.append(self._hold_positions, finger), zeros, zeros

    def _freeze(self, positions: np.ndarray) -> None:
        """Hold `positions` (arm, optionally + finger) as the setpoint; trajectory stops."""
        arm = np.array(positions[: self.robot.dof], dtype=float)
        if len(positions) > self.robot.dof:
            self._finger_goal = float(positions[self.robot.dof])
        self._sampler = None
        self._sampler_has_finger = False
        self._hold_positions = arm
        self._forward_until = None
        self.data.ctrl[self._arm_actuators] = arm
