"""Scripted experts: Cartesian waypoints on the known scene state, numeric IK with MuJoCo.

Each control step the expert moves its Cartesian setpoint (TCP position + gripper yaw, the
gripper always pointing down) toward the current waypoint at a bounded speed and acceleration,
braking to arrive at rest, then solves
damped-least-squares IK (mj_jac at the TCP) from the previous joint command, so consecutive
commands are close and smooth. Waypoints are recomputed from the scene every step, so the
experts follow a cube that moves (pushed, sliding) instead of replaying a fixed plan.

The output is the absolute joint target for the next control step plus the gripper width:
exactly the action columns of the policy (7 arm joints + width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from vla_runtime.core.robot import load_robot
from vla_runtime.sim.tasks import (
    CONTROL_DT,
    HALF,
    HELD_RADIUS,
    ZONE_CENTRE,
    EpisodeSetup,
    SceneSnapshot,
    slide_position,
)
from vla_runtime.sim.workcell import TCP_SITE

OPEN = 0.08
CLOSED = 0.0
TRANSIT_SPEED = 0.2  # m/s of the TCP setpoint (below the FR3 collaborative 0.25 m/s)
FINE_SPEED = 0.08  # m/s for descents and pushing
YAW_RATE = 1.5  # rad/s
# The setpoint speeds up and slows down at most this fast (and stops at each waypoint), so the
# joint commands stay inside the accelerations the safety node lets a chunk plan (70 % of the
# robot's table: 3.5 rad/s^2 on the UR5e): a policy imitating an expert that changes speed
# within one step asks for motions the safety node then slows down.
ACCELERATION = 0.7  # m/s^2 of the TCP setpoint
YAW_ACCELERATION = 2.0  # rad/s^2
ARRIVED = 0.006  # m: a waypoint counts as reached
HAND_AT = 0.003  # m of width: the fingers are at their command
HAND_STILL = 0.0003  # m of width per control step: the fingers have stopped (on an object)
# reach: the TCP ends 1.2 cm above the cube centre, the open fingers around the cube's upper
# half (they clear it at any yaw). The touch detector's radius (3.2 cm) is crossed on the way
# down, so a policy that stops a little high or off-centre still touches; an expert stopping
# at the radius's edge teaches a policy to hover just outside it.
REACH_HEIGHT = 0.012
# dynamic reach: the TCP ends at the sliding cube's centre height, the open fingers (8 cm) around
# it, their tips ~11 mm above the table: the touch radius is then all room for a hand that
# trails the cube (a one-frame policy cannot see its velocity). Policies taught to end 12 mm
# above the centre hovered 2-3 cm above it, at the radius's edge.
DYNAMIC_REACH_HEIGHT = 0.0
# dynamic reach: the hand starts down once within this of the point above the sliding cube and
# keeps chasing it on the way down (the open fingers still clear the cube by 5 mm a side). An
# expert that first aligns within ARRIVED teaches a policy that trails the cube by a centimetre
# or two to hover above it and never descend.
DYNAMIC_DESCEND_WITHIN = 0.015
# dynamic reach: the expert aims where the cube will be when the hand gets there, at least the
# arm's tracking lag ahead and at most this far (further, a policy's error in the cube's velocity
# from two frames outweighs the lead).
TRACKING_LAG = 0.25  # s
MAX_LEAD = 1.0  # s
# pick: the TCP height of the grasp. The open fingertips clear the table by ~11 mm there (by
# 4 mm at 12 mm, where policies imitating the descent a few mm low pressed the table and the
# consequence check vetoed them); the pads still close on the cube's lower half.
GRASP_HEIGHT = 0.020
# push: the TCP height behind and against the cube. The closed fingertips clear the table by
# ~15 mm (by 9 mm at 18 mm, where policies pressed the table while pushing).
PUSH_HEIGHT = 0.024
# An expert taking over mid-task skips the approach from above within this lateral distance
# of its target (open fingers clear a 4 cm cube by 2 cm a side).
RESUME_LATERAL = 0.03
HELD_LIFT = 0.01  # m: a cube this far above its resting height, near the TCP, is being held


def intercept_lead(distance: float) -> float:
    """Seconds ahead of a sliding cube to aim, `distance` (m) beside it: about the time the hand
    needs to get there, so labels from afar already head where the cube will be (a policy seeing
    the cube move then learns to lead it), and the tracking lag once there."""
    return min(MAX_LEAD, max(TRACKING_LAG, distance / TRANSIT_SPEED))


def braking_speed(distance: float, acceleration: float) -> float:
    """The speed from which `acceleration` stops in `distance`, stepped at CONTROL_DT: the
    setpoint arrives at rest instead of overshooting."""
    # v^2 = 2 a d, less half a step of travel at that speed (discrete steps brake late).
    return max(math.sqrt(2.0 * acceleration * distance + (acceleration * CONTROL_DT / 2) ** 2)
               - acceleration * CONTROL_DT / 2, 0.0)  # fmt: skip


def hand_rotation(yaw: float) -> np.ndarray:
    """Gripper pointing down (hand z = -world z), hand x at `yaw` in the table plane."""
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, s, 0.0], [s, -c, 0.0], [0.0, 0.0, -1.0]])


def grasp_yaw(cube_yaw: float, reference: float = 0.0) -> float:
    """Gripper yaw aligned with a cube face: the cube's yaw modulo 90 deg, nearest `reference`."""
    quarter = math.pi / 2
    return reference + (cube_yaw - reference + quarter / 2) % quarter - quarter / 2


def cube_yaw(quat_wxyz) -> float:
    w, x, y, z = quat_wxyz
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


class ArmKinematics:
    """The arm's forward kinematics and IK for the TCP on a private MjData of the scene model."""

    def __init__(self, model: mujoco.MjModel, robot: str = "fr3"):
        self.model = model
        self.data = mujoco.MjData(model)
        self.robot = load_robot(robot)
        self.dof = self.robot.dof
        self.hand = model.body("hand").id
        self.tcp = model.site(TCP_SITE).id
        self.lower = np.array(self.robot.position_min) + 0.05
        self.upper = np.array(self.robot.position_max) - 0.05
        self.home = np.array(self.robot.home)
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))

    def tcp_pose(self, q) -> tuple[np.ndarray, np.ndarray]:
        self.data.qpos[: self.dof] = q
        mujoco.mj_kinematics(self.model, self.data)
        rotation = self.data.xmat[self.hand].reshape(3, 3).copy()
        return self.data.site_xpos[self.tcp].copy(), rotation

    def solve(self, q_seed, position, rotation, iterations: int = 12) -> np.ndarray:
        """Joint positions putting the TCP at `position` with hand orientation `rotation`."""
        q = np.array(q_seed, dtype=float)
        damping = 1e-3
        for _ in range(iterations):
            tcp, current = self.tcp_pose(q)
            mujoco.mj_comPos(self.model, self.data)
            err_p = position - tcp
            # orientation error: axis-angle of rotation @ current^T (small-angle form)
            err_r = 0.5 * sum(np.cross(current[:, i], rotation[:, i]) for i in range(3))
            if np.linalg.norm(err_p) < 1e-4 and np.linalg.norm(err_r) < 1e-3:
                break
            mujoco.mj_jac(self.model, self.data, self._jacp, self._jacr, tcp, self.hand)
            jac = np.vstack([self._jacp[:, : self.dof], self._jacr[:, : self.dof]])
            err = np.concatenate([err_p, err_r])
            jjt = jac @ jac.T + damping * np.eye(6)
            dq = jac.T @ np.linalg.solve(jjt, err)
            # Null-space pull toward home (not joint 7: it sets the yaw) keeps the elbow up.
            null = np.eye(self.dof) - jac.T @ np.linalg.solve(jjt, jac)
            posture = 0.1 * (self.home - q)
            posture[-1] = 0.0
            q = np.clip(q + dq + null @ posture, self.lower, self.upper)
        return q


@dataclass
class Waypoint:
    position: np.ndarray
    yaw: float
    speed: float
    gripper: float
    dwell: int = 0  # control steps to stay once reached (e.g. to build the grip)
    # The arm waits for the hand: it moves toward this point, and counts it as reached, only once
    # the fingers have reached `gripper` or stopped on an object (a real hand needs 0.4 s to
    # close on a cube; pushing or lifting with half-open fingers fails).
    hand_first: bool = False
    arrived_within: float = ARRIVED  # m: the distance at which it counts as reached


class ScriptedExpert:
    """Task-specific waypoint logic shared by every task: `act` -> (joint target, width)."""

    def __init__(self, setup: EpisodeSetup, kinematics: ArmKinematics):
        self.setup = setup
        self.kin = kinematics
        self.phase = 0
        self.wait = 0
        self.q_cmd: np.ndarray | None = None
        self.pos_cmd = np.zeros(3)
        self.yaw_cmd = 0.0
        self.velocity = np.zeros(3)  # of the TCP setpoint, m/s
        self.yaw_velocity = 0.0  # rad/s
        self._previous_cube: np.ndarray | None = None
        self._frozen: list[Waypoint] | None = None
        self._width: float | None = None  # the gripper width one step ago
        self._still_steps = 0  # steps the fingers have not moved

    # -- per-task waypoints ----------------------------------------------------------------
    def plan(self, state: SceneSnapshot, cube_quat) -> list[Waypoint]:
        """The task's waypoints given the scene now (the phase index walks through them)."""
        task = self.setup.task
        cube = state.cubes[self.setup.target]
        if task in ("reach", "dynamic_reach"):
            dynamic = task == "dynamic_reach"
            aim = cube
            if dynamic and self._previous_cube is not None:
                velocity = (cube - self._previous_cube)[:2] / CONTROL_DT
                lead = intercept_lead(float(np.linalg.norm(cube[:2] - self.pos_cmd[:2])))
                aim = np.array([*slide_position(cube[:2], velocity, lead), cube[2]])
            low = DYNAMIC_REACH_HEIGHT if dynamic else REACH_HEIGHT
            within = DYNAMIC_DESCEND_WITHIN if dynamic else ARRIVED
            above = aim + [0.0, 0.0, HALF + 0.06]
            return [
                Waypoint(above, 0.0, TRANSIT_SPEED, OPEN, arrived_within=within),
                Waypoint(aim + [0.0, 0.0, low], 0.0, 0.12, OPEN),
            ]
        if task == "pick":
            if self._frozen is not None:  # grasped: the cube moves with the hand now
                return self._frozen
            yaw = grasp_yaw(cube_yaw(cube_quat))
            grasp = np.array([cube[0], cube[1], GRASP_HEIGHT])
            plan = [
                Waypoint(cube + [0.0, 0.0, 0.1], yaw, TRANSIT_SPEED, OPEN),
                Waypoint(grasp, yaw, FINE_SPEED, OPEN),
                Waypoint(grasp, yaw, FINE_SPEED, CLOSED, dwell=4, hand_first=True),
                Waypoint(np.array([cube[0], cube[1], 0.16]), yaw, FINE_SPEED, CLOSED),
            ]
            if self.phase >= 2:
                self._frozen = plan
            return plan
        if task == "push":
            offset = np.array(ZONE_CENTRE) - cube[:2]
            distance = float(np.linalg.norm(offset))
            direction = offset / max(distance, 1e-6)
            yaw = math.atan2(direction[1], direction[0])
            behind = cube[:2] - (HALF + 0.03) * direction
            # pushing: chase a point 1 cm into the cube so the contact keeps pressing
            press = cube[:2] - (HALF + 0.005 - 0.01) * direction
            low = PUSH_HEIGHT
            if self.phase == 2 and distance < 0.015:
                self.phase = 3
            return [
                Waypoint(np.array([*behind, 0.1]), yaw, TRANSIT_SPEED, CLOSED),
                Waypoint(np.array([*behind, low]), yaw, FINE_SPEED, CLOSED),
                Waypoint(np.array([*press, low]), yaw, 0.06, CLOSED, dwell=10**6, hand_first=True),
                Waypoint(np.array([*self.pos_cmd[:2], 0.12]), self.yaw_cmd, FINE_SPEED, CLOSED),
            ]
        raise ValueError(task)

    def resume_phase(self, state: SceneSnapshot, cube_quat) -> int:
        """The waypoint to start at when taking over mid-task (a recovery branch): skip the
        approach from above when the TCP is already over the target, low and nearly aligned.
        From home this is always 0. Restarting at 0 would label a policy that is 1 cm off the
        cube with "rise 5 cm, then come back down" — teaching it to hover, not to correct."""
        plan = self.plan(state, cube_quat)
        tcp = self.pos_cmd
        task = self.setup.task
        if task in ("reach", "dynamic_reach"):
            aim = plan[1].position
            lateral = np.linalg.norm(tcp[:2] - aim[:2])
            return int(lateral < RESUME_LATERAL and tcp[2] < plan[0].position[2] + 0.01)
        if task == "pick":
            cube = state.cubes[self.setup.target]
            if cube[2] > HALF + HELD_LIFT and np.linalg.norm(state.tcp - cube) <= HELD_RADIUS:
                # Already holding it off the table: keep the grip and lift on from here.
                # Restarting the approach would open the hand and teach a policy to let go.
                lift = plan[3]
                up = np.array([tcp[0], tcp[1], lift.position[2]])
                self._frozen = [*plan[:3], Waypoint(up, self.yaw_cmd, lift.speed, lift.gripper)]
                return 3
            grasp = plan[1].position
            lateral = np.linalg.norm(tcp[:2] - grasp[:2])
            if lateral > RESUME_LATERAL / 2 or tcp[2] > plan[0].position[2] + 0.01:
                return 0
            return 2 if tcp[2] < grasp[2] + ARRIVED else 1  # at grasp height: close the hand
        if task == "push":
            behind, press = plan[1].position, plan[2].position
            direction = (press - behind)[:2] / max(np.linalg.norm((press - behind)[:2]), 1e-6)
            offset = tcp[:2] - behind[:2]
            across = abs(offset[0] * direction[1] - offset[1] * direction[0])
            along = float(offset @ direction)  # the cube's near face is at +0.03
            if across > 0.025 or along > 0.025:
                return 0  # beside or on top of the cube: go round from above
            if tcp[2] < behind[2] + 0.02:  # low behind it: push on, the press point steers back
                return 2 if along > -0.03 else 1
            return 1 if across < RESUME_LATERAL / 2 and tcp[2] < plan[0].position[2] + 0.01 else 0
        return 0

    def _hand_ready(self, point: Waypoint, width: float) -> bool:
        if not point.hand_first:
            return True
        return abs(width - point.gripper) < HAND_AT or self._still_steps >= 2

    def _advance(self, plan: list[Waypoint], width: float) -> Waypoint:
        point = plan[self.phase]
        arrived = np.linalg.norm(point.position - self.pos_cmd) < point.arrived_within
        if arrived and self._hand_ready(point, width):
            if self.wait < point.dwell:
                self.wait += 1
            elif self.phase < len(plan) - 1:
                self.phase += 1
                self.wait = 0
        return plan[self.phase]

    # -- control ---------------------------------------------------------------------------
    def act(self, state: SceneSnapshot, q_measured, cube_quat=(1.0, 0.0, 0.0, 0.0)):
        """Joint target for the next control step and the gripper width command."""
        if self.q_cmd is None:
            self.q_cmd = np.array(q_measured, dtype=float)
            self.pos_cmd, rotation = self.kin.tcp_pose(self.q_cmd)
            self.yaw_cmd = math.atan2(rotation[1, 0], rotation[0, 0])
            self.phase = self.resume_phase(state, cube_quat)
        width = float(state.gripper_width)
        moved = abs(width - self._width) if self._width is not None else 1.0
        self._still_steps = self._still_steps + 1 if moved < HAND_STILL else 0
        self._width = width
        point = self._advance(self.plan(state, cube_quat), width)
        cube = state.cubes.get(self.setup.target)  # none seen: a move that needs no cube
        self._previous_cube = None if cube is None else cube.copy()
        target = point.position if self._hand_ready(point, width) else self.pos_cmd  # hand first
        step = target - self.pos_cmd
        distance = float(np.linalg.norm(step))
        speed = min(point.speed, braking_speed(distance, ACCELERATION))
        wanted = step * (speed / distance) if distance > 1e-9 else np.zeros(3)
        change = wanted - self.velocity
        most = ACCELERATION * CONTROL_DT
        norm = float(np.linalg.norm(change))
        self.velocity = self.velocity + (change if norm <= most else change * (most / norm))
        self.pos_cmd = self.pos_cmd + self.velocity * CONTROL_DT
        dyaw = (point.yaw - self.yaw_cmd + math.pi) % (2 * math.pi) - math.pi
        wanted_yaw = math.copysign(min(YAW_RATE, braking_speed(abs(dyaw), YAW_ACCELERATION)), dyaw)
        most = YAW_ACCELERATION * CONTROL_DT
        self.yaw_velocity += float(np.clip(wanted_yaw - self.yaw_velocity, -most, most))
        self.yaw_cmd += self.yaw_velocity * CONTROL_DT
        self.q_cmd = self.kin.solve(self.q_cmd, self.pos_cmd, hand_rotation(self.yaw_cmd))
        return self.q_cmd.copy(), float(point.gripper)
