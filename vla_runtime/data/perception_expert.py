"""A scripted expert that acts on what the cameras see, run by the engine node as a policy
(`backend:=python checkpoint:=vla_runtime.data.perception_expert:PerceptionExpert`).

It is the task suite's scripted expert (`data/experts.py`: Cartesian waypoints, bounded speed
and acceleration, damped least-squares IK) with the simulator's state replaced by perception
(`data/scene_perception.py`): cube positions from the calibrated scene and wrist cameras, the
TCP and gripper width from the joint readings in the observation. Running as the engine's
policy puts it on the product path: its chunks go through the safety node's checks, the
streamer and the driver like a learned policy's.

It takes its goal from the instruction: the task suite's instructions, and three that the
collector uses to reset the workcell by itself: `place the <colour> cube at (x, y)` (pick it up
and put it down there), `return to home`, and `move the hand to (x, y, z) at yaw Y` (an
episode's start away from home). Each chunk continues the plan the streamer is
executing (the request's plan): the expert's Cartesian setpoint resumes where that plan ends,
so consecutive chunks join without a jump. Steps waiting for the hand (closing on a cube,
opening to release it) advance only on measured finger widths, never on predicted ones.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode
from vla_runtime.core.robot import load_robot
from vla_runtime.data.experts import (
    ARRIVED,
    CLOSED,
    FINE_SPEED,
    HAND_AT,
    OPEN,
    TRANSIT_SPEED,
    ArmKinematics,
    ScriptedExpert,
    Waypoint,
    braking_speed,
    cube_yaw,
    grasp_yaw,
)
from vla_runtime.data.scene_perception import (
    HELD_WIDTH,
    IN_HAND,
    CameraRig,
    ScenePerception,
)
from vla_runtime.engine.policy import (
    ActionChunk,
    ActionSpace,
    CameraSpec,
    Observation,
    PolicyError,
    PolicySpec,
)
from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.tasks import (
    CONTROL_DT,
    INSTRUCTIONS,
    ZONE_CENTRE,
    EpisodeSetup,
    SceneSnapshot,
)
from vla_runtime.sim.workcell import COLOURS, SceneConfig

PLACE = "place the {colour} cube at ({x:.3f}, {y:.3f})"
HOME = "return to home"
MOVE = "move the hand to ({x:.3f}, {y:.3f}, {z:.3f}) at yaw {yaw:.3f}"
CARRY_HEIGHT = 0.1  # m of the TCP while carrying a cube to its new place
PLACE_TCP_Z = 0.015  # the held cube's bottom 3 mm above the table (grasped 8 mm below its centre)
GRASP_TCP_Z = 0.012
RISE_Z = 0.12
HAND_STILL_M = 0.0005  # the fingers moved less than this over HAND_STILL_S: they have stopped
HAND_STILL_S = 0.12
# A hand step is done when the fingers reach the commanded width, or stop after moving at least
# HAND_MOVED_M since the step began (on something in the way), or stay still for HAND_WAIT_S
# (blocked from the start). A hand whose width is read only between its blocking calls
# (franky's Gripper) shows no motion until its call ends: stillness alone proves nothing.
HAND_MOVED_M = 0.002
HAND_WAIT_S = 3.0
HOME_SPEED = 0.6  # rad/s of the fastest joint on the way home
HOME_ACCELERATION = 1.5  # rad/s^2


@dataclass(frozen=True)
class Goal:
    task: str  # reach, push, pick, place, home, move
    colour: str = ""
    place_xy: tuple[float, float] | None = None
    pose: tuple[float, float, float, float] | None = None  # move: TCP x, y, z and yaw


def _patterns() -> list[tuple[re.Pattern, str]]:
    colour = "(?P<colour>" + "|".join(COLOURS) + ")"
    found = []
    for task, template in INSTRUCTIONS.items():
        if task == "dynamic_reach":  # a moving cube needs a tracked velocity, not done here
            continue
        found.append((re.compile("^" + template.replace("{colour}", colour) + "$"), task))
    value = r"-?\d+(?:\.\d+)?"
    place = rf"^place the {colour} cube at \((?P<x>{value}), (?P<y>{value})\)$"
    found.append((re.compile(place), "place"))
    found.append((re.compile("^" + HOME + "$"), "home"))
    move = (rf"^move the hand to \((?P<x>{value}), (?P<y>{value}), (?P<z>{value})\) "
            rf"at yaw (?P<yaw>{value})$")  # fmt: skip
    found.append((re.compile(move), "move"))
    return found


PATTERNS = _patterns()


def parse_instruction(text: str) -> Goal:
    """The goal an instruction names; PolicyError for one the expert cannot do."""
    for pattern, task in PATTERNS:
        match = pattern.match(text.strip())
        if match is None:
            continue
        groups = match.groupdict()
        xy = (float(groups["x"]), float(groups["y"])) if task == "place" else None
        pose = None
        if task == "move":
            pose = tuple(float(groups[k]) for k in ("x", "y", "z", "yaw"))
        return Goal(task, groups.get("colour") or "", xy, pose)
    raise PolicyError(f"the perception expert cannot do {text!r}")


class PerceivedExpert(ScriptedExpert):
    """The scripted expert with two more goals (place, home) and a hand known only from
    measurements: `hand_known` is False for steps predicted beyond the observation."""

    def __init__(self, goal: Goal, kinematics: ArmKinematics, colours):
        task = goal.task if goal.task not in ("place", "home", "move") else "pick"
        setup = EpisodeSetup(task, 0, tuple(colours), goal.colour or colours[0], {}, {})
        super().__init__(setup, kinematics)
        self.goal = goal
        self.hand_known = True
        self.hand_still = False
        self.stamp = 0.0  # of the observation the measured width is from
        self._ready_for: float | None = None  # the width the hand was measured to be done at
        self._hand_step: tuple[float, float, float] | None = None  # goal, width, stamp at start
        self.joint_velocity = np.zeros(kinematics.dof)  # rad/s of the joint setpoint (home)

    def _hand_ready(self, point: Waypoint, width: float) -> bool:
        if not point.hand_first:
            return True
        if not self.hand_known:  # a predicted step: ready only if measured ready already
            return self._ready_for == point.gripper
        if self._hand_step is None or self._hand_step[0] != point.gripper:
            self._hand_step = (point.gripper, width, self.stamp)
        _, first_width, since = self._hand_step
        moved = abs(width - first_width) > HAND_MOVED_M or self.stamp - since > HAND_WAIT_S
        ready = abs(width - point.gripper) < HAND_AT or (self.hand_still and moved)
        self._ready_for = point.gripper if ready else None
        return ready

    def act(self, state: SceneSnapshot, q_measured, cube_quat=(1.0, 0.0, 0.0, 0.0)):
        if self.goal.task != "home":
            return super().act(state, q_measured, cube_quat)
        # Home in joint space: a Cartesian move would end anywhere along the arm's redundancy.
        if self.q_cmd is None:
            self.q_cmd = np.array(q_measured, dtype=float)
        error = self.kin.home - self.q_cmd
        remaining = float(np.abs(error).max())
        speed = min(HOME_SPEED, braking_speed(remaining, HOME_ACCELERATION))
        wanted = error * (speed / remaining) if remaining > 1e-9 else np.zeros_like(error)
        change = wanted - self.joint_velocity
        most = HOME_ACCELERATION * CONTROL_DT
        largest = float(np.abs(change).max())
        self.joint_velocity = self.joint_velocity + (change if largest <= most
                                                     else change * (most / largest))  # fmt: skip
        self.q_cmd = self.q_cmd + self.joint_velocity * CONTROL_DT
        self.pos_cmd, rotation = self.kin.tcp_pose(self.q_cmd)
        self.yaw_cmd = math.atan2(rotation[1, 0], rotation[0, 0])
        return self.q_cmd.copy(), OPEN

    def resume_phase(self, state: SceneSnapshot, cube_quat) -> int:
        return 0 if self.goal.task == "move" else super().resume_phase(state, cube_quat)

    def plan(self, state: SceneSnapshot, cube_quat) -> list[Waypoint]:
        if self.goal.task == "move":
            x, y, z, yaw = self.goal.pose
            return [Waypoint(np.array([x, y, z]), yaw, TRANSIT_SPEED, OPEN)]
        if self.goal.task != "place":
            return super().plan(state, cube_quat)
        if self._frozen is not None:
            return self._frozen
        cube = state.cubes[self.setup.target]
        yaw = grasp_yaw(cube_yaw(cube_quat), self.yaw_cmd)
        x, y = self.goal.place_xy
        grasp = np.array([cube[0], cube[1], GRASP_TCP_Z])
        plan = [
            Waypoint(np.array([cube[0], cube[1], CARRY_HEIGHT]), yaw, TRANSIT_SPEED, OPEN),
            Waypoint(grasp, yaw, FINE_SPEED, OPEN),
            Waypoint(grasp, yaw, FINE_SPEED, CLOSED, dwell=4, hand_first=True),
            Waypoint(np.array([cube[0], cube[1], CARRY_HEIGHT]), yaw, FINE_SPEED, CLOSED),
            *self._put_down(x, y, yaw),
        ]
        if self.phase >= 2:
            self._frozen = plan
        return plan

    def _put_down(self, x: float, y: float, yaw: float) -> list[Waypoint]:
        return [
            Waypoint(np.array([x, y, CARRY_HEIGHT]), yaw, TRANSIT_SPEED, CLOSED),
            Waypoint(np.array([x, y, PLACE_TCP_Z]), yaw, FINE_SPEED, CLOSED),
            Waypoint(
                np.array([x, y, PLACE_TCP_Z]), yaw, FINE_SPEED, OPEN, dwell=2, hand_first=True
            ),  # fmt: skip
            Waypoint(np.array([x, y, RISE_Z]), yaw, FINE_SPEED, OPEN),
        ]

    def carry_from_here(self) -> None:
        """Already holding the cube: skip the grasp, carry it from where the hand is."""
        x, y = self.goal.place_xy
        lift = Waypoint(np.array([*self.pos_cmd[:2], CARRY_HEIGHT]), self.yaw_cmd, FINE_SPEED,
                        CLOSED)  # fmt: skip
        self._frozen = [lift, lift, lift, lift, *self._put_down(x, y, self.yaw_cmd)]
        self.phase = 3

    @property
    def finished(self) -> bool:
        """A reset move is done: its setpoint at the last waypoint, (nearly) at rest."""
        if self.goal.task == "home":
            remaining = float(np.abs(self.kin.home - self.q_cmd).max())
            return remaining < 0.002 and float(np.abs(self.joint_velocity).max()) < 0.01
        if self.goal.task == "move":
            target = np.array(self.goal.pose[:3])
            turn = (self.goal.pose[3] - self.yaw_cmd + math.pi) % (2 * math.pi) - math.pi
            if abs(turn) > 0.01 or abs(self.yaw_velocity) > 0.05:
                return False
        elif self.goal.task == "place" and self._frozen is not None:
            if self.phase < len(self._frozen) - 1:
                return False
            target = self._frozen[-1].position
        else:
            return False
        arrived = float(np.linalg.norm(target - self.pos_cmd)) < ARRIVED
        # The discrete braking dithers around a reached waypoint by up to ~0.02 m/s.
        return arrived and float(np.linalg.norm(self.velocity)) < 0.03


class _PushedCube:
    """Within a predicted chunk, a cube being pushed moves on with the pusher (the cameras see
    it again at the next chunk): without this the pusher would brake to a stop at the cube's
    observed place every chunk."""

    def __init__(self, snapshot: SceneSnapshot, goal: Goal, expert: PerceivedExpert):
        self.snapshot, self.goal, self.expert = snapshot, goal, expert
        self.cube = snapshot.cubes.get(goal.colour)
        self.start = expert.pos_cmd.copy()

    def predict(self, step: int) -> None:
        if self.goal.task != "push" or self.cube is None or step == 0 or self.expert.phase != 2:
            return
        offset = np.array(ZONE_CENTRE) - self.cube[:2]
        direction = offset / max(float(np.linalg.norm(offset)), 1e-6)
        advance = max(float((self.expert.pos_cmd - self.start)[:2] @ direction), 0.0)
        moved = self.cube.copy()
        moved[:2] += advance * direction
        self.snapshot.cubes[self.goal.colour] = moved


def _yaw_quat(yaw: float) -> tuple[float, float, float, float]:
    return (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))


# The expert's discrete progress, kept per predicted step: the next chunk resumes from the step
# where the streamer's plan ends.
MEMORY = ("phase", "wait", "_frozen", "_previous_cube", "velocity", "yaw_velocity",
          "joint_velocity")  # fmt: skip


class PerceptionExpert:
    """The `Policy` (engine/policy.py) of the perception expert."""

    def __init__(self, robot: str = "fr3", seed: int = 0, calibration_dir: str = "calibration/sim",
                 cameras: dict | None = None, chunk_len: int = 16,
                 colours: list | None = None):  # fmt: skip
        """`cameras`: image topic name -> [calibration file stem, image size]."""
        del seed  # deterministic
        cameras = cameras or {"scene_hd": ["scene", 224], "wrist": ["wrist", 96]}
        config = load_robot(robot)
        self.dof = config.dof
        self.colours = tuple(colours or ("red", "green", "blue"))
        self._spec = PolicySpec(
            cameras=tuple(
                CameraSpec(name, int(size), int(size)) for name, (_, size) in cameras.items()
            ),  # fmt: skip
            state_dim=self.dof + 1,
            action_dim=self.dof + 1,
            chunk_len=int(chunk_len),
            dt=CONTROL_DT,
            action_space=ActionSpace.JOINT_POSITIONS,
            gripper=True,
            joint_names=(*config.joints, config.gripper_joints[0]),
            robot=robot,
        )
        rig = CameraRig(calibration_dir, {name: stem for name, (stem, _) in cameras.items()}, robot)
        self.perception = ScenePerception(rig, self.colours)
        model, _ = build_scene(SceneConfig(robot=robot, n_cubes=0))
        self.kinematics = ArmKinematics(model, robot)
        self.expert: PerceivedExpert | None = None
        self._segment: tuple | None = None
        self._memory: dict[float, dict] = {}  # action time -> the expert's progress then
        self._widths: list[tuple[float, float]] = []
        self._fresh = True
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # previous chunk: times, rows

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    # -- the Policy contract ----------------------------------------------------------------

    def infer(
        self,
        observation: Observation,
        compute_mode: ComputeMode = FULL_COMPUTE,
        plan: np.ndarray | None = None,
        noise_scale: float | None = None,
    ) -> ActionChunk:
        del compute_mode, noise_scale
        goal = parse_instruction(observation.instruction)
        state = np.asarray(observation.state, float)
        arm, width, stamp = state[: self.dof], float(state[self.dof]), observation.stamp
        segment = (observation.episode_start, observation.instruction)
        if segment != self._segment:
            self._begin(goal, segment)
        scene = self.perception.update(observation.images, arm, width, stamp,
                                       observation.camera_stamps)  # fmt: skip
        expert = self.expert
        if goal.colour and goal.colour not in scene.cubes:
            raise PolicyError(f"the {goal.colour} cube is not in view")
        self._note_width(stamp, width)
        snapshot = SceneSnapshot(scene.tcp, width, {c: t.position for c, t in scene.cubes.items()})
        rows, resumed_at = self._resume(expert, arm, stamp, plan)
        if self._fresh:
            self._fresh = False
            if goal.task == "place" and self._holding(goal.colour, width, scene):
                expert.carry_from_here()
        track = scene.cubes.get(goal.colour)
        quat = _yaw_quat(track.yaw if track is not None and track.yaw is not None else 0.0)
        expert.hand_still, expert.stamp = self._hand_still(stamp), stamp
        self._memory = {t: m for t, m in self._memory.items() if t > stamp - 1.0}
        pushed = _PushedCube(snapshot, goal, expert)
        finished = False
        for k in range(self.spec.chunk_len - len(rows)):
            expert.hand_known = k == 0
            pushed.predict(k)
            q, command = expert.act(snapshot, arm, quat)
            if k == 0:  # done by the first predicted step, not by the end of the prediction
                finished = expert.finished
            rows.append(np.append(q, command))
            memory = {name: getattr(expert, name) for name in MEMORY}
            self._memory[resumed_at + (k + 1) * CONTROL_DT] = memory
        self._mark_held(goal, width, scene)
        actions = np.asarray(rows[: self.spec.chunk_len], np.float32)
        times = stamp + CONTROL_DT * np.arange(1, len(actions) + 1)
        self._last = (times, actions.astype(float))
        info = {"expert_phase": float(expert.phase), "expert_finished": float(finished),
                "plan_rows": float(0 if plan is None else len(plan)),
                "episode_start": float(observation.episode_start),
                "target_sigma_mm": 1000.0 * track.sigma_m if track else math.nan}  # fmt: skip
        return ActionChunk(actions, stamp, info=info)

    # -- internals --------------------------------------------------------------------------

    def _begin(self, goal: Goal, segment: tuple) -> None:
        self.expert = PerceivedExpert(goal, self.kinematics, self.colours)
        self._segment = segment
        self._memory.clear()
        self._widths.clear()
        self._fresh = True
        self._last = None

    def _resume(self, expert: PerceivedExpert, arm, stamp: float, plan) -> tuple[list, float]:
        """Start the expert's setpoint where the plan being executed is one step after `stamp`
        (the streamer's plan from the request, else this policy's previous chunk), or at the
        measured state; returns the chunk rows the streamer's plan fixes (plan[k] is action k,
        at stamp + (k + 1) dt) and the time of the last of them."""
        if plan is not None and len(plan) > 0 and expert.q_cmd is not None:
            plan = np.asarray(plan, float)
            end = stamp + len(plan) * CONTROL_DT
            before = plan[-2] if len(plan) > 1 else self._previous_row(end - CONTROL_DT)
            self._continue(expert, plan[-1], before, end)
            return list(plan), end
        row = self._previous_row(stamp + CONTROL_DT)
        if row is not None and expert.q_cmd is not None:
            # Not in the request (the engine sends none when the answer is due within a step):
            # the previous chunk is what runs now, so the new one starts where it will be.
            self._continue(expert, row, self._previous_row(stamp), stamp + CONTROL_DT)
            return [row], stamp + CONTROL_DT
        self._memory.clear()  # a restart from the measured state: nothing predicted holds
        self._continue(expert, arm, None, stamp)
        return [], stamp

    def _previous_row(self, t: float) -> np.ndarray | None:
        """This policy's previous chunk at time t (interpolated), None outside it."""
        if self._last is None:
            return None
        times, rows = self._last
        if not times[0] - 1e-6 <= t <= times[-1] + 1e-6:
            return None
        return np.array([np.interp(t, times, rows[:, j]) for j in range(rows.shape[1])])

    def _continue(self, expert: PerceivedExpert, row, before, t: float) -> None:
        """The expert's state at time t, on the chunk row `row`: its progress and setpoint
        velocities as predicted for t, else velocities from the row before (None: at rest)."""
        expert.q_cmd = np.asarray(row[: self.dof], float).copy()
        expert.pos_cmd, rotation = self.kinematics.tcp_pose(expert.q_cmd)
        expert.yaw_cmd = math.atan2(rotation[1, 0], rotation[0, 0])
        memory = self._recall(t)
        if memory is not None:  # exact velocities: IK rows differ by the solver's noise
            for name, value in memory.items():
                setattr(expert, name, value)
            return
        expert.velocity, expert.yaw_velocity = np.zeros(3), 0.0
        expert.joint_velocity = np.zeros(self.dof)
        if before is not None:
            before = np.asarray(before[: self.dof], float)
            expert.joint_velocity = (expert.q_cmd - before) / CONTROL_DT
            previous, turned = self.kinematics.tcp_pose(before)
            expert.velocity = (expert.pos_cmd - previous) / CONTROL_DT
            yaw = math.atan2(turned[1, 0], turned[0, 0])
            turn = (expert.yaw_cmd - yaw + math.pi) % (2 * math.pi) - math.pi
            expert.yaw_velocity = turn / CONTROL_DT

    def _recall(self, t: float) -> dict | None:
        """The expert's progress as predicted for time t (within half a step)."""
        if not self._memory:
            return None
        nearest = min(self._memory, key=lambda k: abs(k - t))
        return self._memory[nearest] if abs(nearest - t) <= 0.5 * CONTROL_DT else None

    def _note_width(self, stamp: float, width: float) -> None:
        self._widths.append((stamp, width))
        self._widths = [(t, w) for t, w in self._widths if stamp - t <= 1.0]

    def _hand_still(self, stamp: float) -> bool:
        recent = [w for t, w in self._widths if stamp - t <= HAND_STILL_S]
        spanned = self._widths and stamp - self._widths[0][0] >= HAND_STILL_S
        return bool(spanned) and max(recent) - min(recent) < HAND_STILL_M

    def _holding(self, colour: str, width: float, scene) -> bool:
        seen = scene.visible.get(IN_HAND, {}).get(colour, 0)
        return HELD_WIDTH[0] <= width <= HELD_WIDTH[1] and seen > 0

    def _mark_held(self, goal: Goal, width: float, scene) -> None:
        """A cube between closed fingers moves with the hand: no table estimate of it then,
        and once let go its old estimate is stale."""
        perception = self.perception
        if goal.colour and self._holding(goal.colour, width, scene):
            perception.held = goal.colour
        elif perception.held is not None and width > HELD_WIDTH[1] + 0.005:
            perception.tracker.forget(perception.held)
            perception.held = None
