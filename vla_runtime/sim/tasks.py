"""Task suite on the simulated workcell: seeded initial conditions, instructions, success.

Tasks (command-line names): `reach` (touch the named cube among distractors), `push` (push the
named cube into the white zone), `pick` (lift the named cube), `dynamic_reach` (touch the named
cube while it slides across the table, so reaction time matters).

Everything is a pure function of (task, seed) or of a `SceneSnapshot` (positions read from the
simulator's qpos), so the detectors can be tested on hand-made states and run identically on the
driver's published /sim/scene_state. `TaskSimulator` is the `Simulator` with the task's scene
(zone marker), layout and the sliding cube; `randomize(seed)` starts a new episode without
resetting sim time, so /clock stays monotonic across episodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import mujoco
import numpy as np

from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD
from vla_runtime.sim.simulator import Simulator
from vla_runtime.sim.workcell import COLOURS, TCP_SITE, SceneConfig

TASKS = ("reach", "push", "pick", "dynamic_reach")
CONTROL_DT = 0.05  # s per expert / policy step (the policy's dt)
CUBE_SIZE = 0.04
HALF = CUBE_SIZE / 2
# Targets are placed in this box (base frame), reachable with the gripper pointing down.
REGION_X = (0.38, 0.62)
REGION_Y = (-0.2, 0.2)
MIN_SPACING = 0.1  # cube centres: room for open fingers between neighbours
ZONE_CENTRE = (0.62, 0.0)
ZONE_HALF = 0.05
TOUCH_RADIUS = 0.032  # reach: TCP within this of the cube centre (fingertips at its top)
LIFT_HEIGHT = 0.05  # pick: cube raised at least this far above its resting height
HELD_RADIUS = 0.06  # pick: and still near the TCP (held, not knocked into the air)
SLIDE_SPEED = (0.03, 0.06)  # dynamic_reach: m/s
SLIDE_REGION_X = (0.36, 0.64)
SLIDE_REGION_Y = (-0.24, 0.24)

INSTRUCTIONS = {
    "reach": "touch the {colour} cube",
    "push": "push the {colour} cube into the white zone",
    "pick": "pick up the {colour} cube",
    "dynamic_reach": "touch the moving {colour} cube",
}
# Control steps at CONTROL_DT before an episode counts as failed.
MAX_STEPS = {"reach": 100, "push": 220, "pick": 160, "dynamic_reach": 120}
N_CUBES = 3  # the target and two distractors


@dataclass(frozen=True)
class EpisodeSetup:
    """Everything random about one episode, drawn from (task, seed)."""

    task: str
    seed: int
    colours: tuple[str, ...]
    target: str  # colour of the target cube
    positions: dict[str, np.ndarray]  # cube colour -> xyz centre
    yaws: dict[str, float]
    slide_velocity: np.ndarray = field(default_factory=lambda: np.zeros(2))

    @property
    def instruction(self) -> str:
        return INSTRUCTIONS[self.task].format(colour=self.target)

    @property
    def target_body(self) -> str:
        return f"cube_{self.target}"

    @property
    def max_steps(self) -> int:
        return MAX_STEPS[self.task]


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    return task


def scene_colours(n_cubes: int = N_CUBES) -> tuple[str, ...]:
    return tuple(COLOURS)[:n_cubes]


def _far_from(xy, others, spacing) -> bool:
    return all(np.linalg.norm(xy - o) >= spacing for o in others)


def _segment_distance(p, a, b) -> float:
    ab = b - a
    t = np.clip(np.dot(p - a, ab) / max(np.dot(ab, ab), 1e-12), 0.0, 1.0)
    return float(np.linalg.norm(p - (a + t * ab)))


def target_start(task: str, rng: np.random.Generator) -> np.ndarray:
    """Where a task's target starts (xy): push, behind the zone, 12-25 cm from it, pushed
    roughly away from the robot; the others, anywhere in the target region."""
    if task == "push":
        zone = np.array(ZONE_CENTRE)
        for _ in range(1000):
            xy = rng.uniform([0.38, -0.15], [0.48, 0.15])
            if 0.12 <= np.linalg.norm(zone - xy) <= 0.25:
                break
        return xy
    return rng.uniform([REGION_X[0], REGION_Y[0]], [REGION_X[1], REGION_Y[1]])


def off_push_corridor(xy, target_xy) -> bool:
    """Push: a distractor at `xy` is clear of the target's way into the zone, including where
    the pusher starts behind the target."""
    zone = np.array(ZONE_CENTRE)
    target_xy = np.asarray(target_xy, float)
    direction = (zone - target_xy) / np.linalg.norm(zone - target_xy)
    start = target_xy - 0.1 * direction
    return _segment_distance(np.asarray(xy, float), start, zone) >= 0.1


def make_setup(task: str, seed: int, n_cubes: int = N_CUBES) -> EpisodeSetup:
    """Seeded initial conditions: which cube is the target, where every cube starts."""
    check_task(task)
    rng = np.random.default_rng([seed, TASKS.index(task)])
    colours = scene_colours(n_cubes)
    target = colours[int(rng.integers(len(colours)))]
    lo, hi = np.array([REGION_X[0], REGION_Y[0]]), np.array([REGION_X[1], REGION_Y[1]])
    target_xy = target_start(task, rng)
    placed = {target: target_xy}
    for colour in colours:
        if colour == target:
            continue
        for _ in range(10000):
            xy = rng.uniform(lo - 0.02, hi + 0.02)
            if not _far_from(xy, placed.values(), MIN_SPACING):
                continue
            if task == "push" and not off_push_corridor(xy, target_xy):
                continue
            break
        else:
            raise ValueError(f"cannot place the {colour} cube for {task} seed {seed}")
        placed[colour] = xy
    positions = {c: np.array([*placed[c], HALF]) for c in colours}
    yaws = {c: float(rng.uniform(-math.pi, math.pi)) for c in colours}
    velocity = np.zeros(2)
    if task == "dynamic_reach":
        speed = rng.uniform(*SLIDE_SPEED)
        heading = rng.uniform(-math.pi, math.pi)
        velocity = speed * np.array([math.cos(heading), math.sin(heading)])
    return EpisodeSetup(task, int(seed), colours, target, positions, yaws, velocity)


def slide_position(start_xy: np.ndarray, velocity: np.ndarray, t: float) -> np.ndarray:
    """Position after t seconds of constant-speed sliding, bouncing off SLIDE_REGION's walls."""
    out = np.empty(2)
    for axis, (lo, hi) in enumerate((SLIDE_REGION_X, SLIDE_REGION_Y)):
        span = hi - lo
        s = (start_xy[axis] - lo + velocity[axis] * t) % (2 * span)
        out[axis] = lo + (s if s <= span else 2 * span - s)
    return out


def slide_velocity(start_xy: np.ndarray, velocity: np.ndarray, t: float) -> np.ndarray:
    """Velocity of `slide_position` at t (sign flips after each bounce)."""
    out = np.empty(2)
    for axis, (lo, hi) in enumerate((SLIDE_REGION_X, SLIDE_REGION_Y)):
        span = hi - lo
        s = (start_xy[axis] - lo + velocity[axis] * t) % (2 * span)
        out[axis] = velocity[axis] if s <= span else -velocity[axis]
    return out


# ------------------------------------------------------------------------------ state + success


@dataclass
class SceneSnapshot:
    """What the detectors look at: TCP position, gripper width, cube centres (world frame)."""

    tcp: np.ndarray
    gripper_width: float
    cubes: dict[str, np.ndarray]  # colour -> xyz


class SceneReader:
    """Reads `SceneSnapshot`s from full qpos vectors with a private copy of the model."""

    def __init__(self, model: mujoco.MjModel, colours: tuple[str, ...]):
        self.model = model
        self.data = mujoco.MjData(model)
        self.colours = colours
        self._tcp = model.site(TCP_SITE).id
        self._cube_adr = {c: model.joint(f"cube_{c}").qposadr[0] for c in colours}
        self._fingers = [model.joint(j).qposadr[0] for j in ("finger_joint1", "finger_joint2")]

    def snapshot(self, qpos) -> SceneSnapshot:
        self.data.qpos[:] = qpos
        mujoco.mj_kinematics(self.model, self.data)
        tcp = self.data.site_xpos[self._tcp]
        width = float(sum(self.data.qpos[a] for a in self._fingers))
        cubes = {c: self.data.qpos[a : a + 3].copy() for c, a in self._cube_adr.items()}
        return SceneSnapshot(tcp.copy(), width, cubes)


def in_zone(xy) -> bool:
    return bool(np.all(np.abs(np.asarray(xy[:2]) - np.array(ZONE_CENTRE)) <= ZONE_HALF))


def is_success(setup: EpisodeSetup, state: SceneSnapshot) -> bool:
    """The task's success detector on one snapshot of the scene."""
    cube = state.cubes[setup.target]
    if setup.task in ("reach", "dynamic_reach"):
        return bool(np.linalg.norm(state.tcp - cube) <= TOUCH_RADIUS)
    if setup.task == "push":
        resting = cube[2] <= HALF + 0.01
        return in_zone(cube) and resting
    if setup.task == "pick":
        lifted = cube[2] >= HALF + LIFT_HEIGHT
        return bool(lifted and np.linalg.norm(state.tcp - cube) <= HELD_RADIUS)
    raise ValueError(setup.task)


def task_progress(setup: EpisodeSetup, state: SceneSnapshot) -> dict[str, float]:
    """How far one snapshot is from success, in the quantities the detector thresholds: where a
    failed episode got stuck (never reached the cube, reached but did not lift, ...)."""
    cube = state.cubes[setup.target]
    progress = {"tcp_to_target_m": float(np.linalg.norm(state.tcp - cube))}
    if setup.task == "pick":
        progress["lift_m"] = float(cube[2] - HALF)
    elif setup.task == "push":
        excess = np.abs(np.asarray(cube[:2]) - np.array(ZONE_CENTRE)) - ZONE_HALF
        progress["target_to_zone_m"] = float(np.linalg.norm(np.maximum(excess, 0.0)))
    return progress


def closest_approach(setup: EpisodeSetup, state: SceneSnapshot) -> dict[str, float]:
    """Where the TCP is relative to the target cube's centre: how far above it and how far
    beside it (horizontally). Kept at an episode's closest approach, it tells a hand that
    hovered over the cube from one that trailed a sliding cube at the right height."""
    offset = state.tcp - state.cubes[setup.target]
    return {
        "tcp_to_target_m": float(np.linalg.norm(offset)),
        "above_m": float(offset[2]),
        "beside_m": float(np.linalg.norm(offset[:2])),
    }


def task_milestones(setup: EpisodeSetup, state: SceneSnapshot) -> list[str]:
    """The task's intermediate stages this snapshot has reached (in task order): the first time
    each is reached shows where an episode spent its time (slow approach, slow grasp, ...)."""
    cube = state.cubes[setup.target]
    near = float(np.linalg.norm(state.tcp - cube)) <= TOUCH_RADIUS
    reached = ["at_cube"] if near else []
    if setup.task == "pick":
        if near and state.gripper_width < CUBE_SIZE + 0.004:
            reached.append("closed_on_cube")
        if cube[2] >= HALF + 0.01:
            reached.append("lifted_1cm")
    elif setup.task == "push":
        if np.linalg.norm(np.asarray(cube[:2]) - np.array(ZONE_CENTRE)) <= 2 * ZONE_HALF:
            reached.append("near_zone")
    return reached


# Per progress quantity: whether larger is better (the episode's best value is kept).
PROGRESS_BETTER_HIGH = {"tcp_to_target_m": False, "lift_m": True, "target_to_zone_m": False}


# ------------------------------------------------------------------------------ simulator


def add_zone_marker(xml: str) -> str:
    """The push zone as a flat white square on the table: visual only (no contacts)."""
    spec = mujoco.MjSpec.from_string(xml)
    spec.worldbody.add_geom(
        name="push_zone",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=[ZONE_HALF, ZONE_HALF, 0.0005],
        pos=[*ZONE_CENTRE, 0.0005],
        rgba=[0.95, 0.95, 0.95, 1.0],
        contype=0,
        conaffinity=0,
    )
    spec.compile()
    return spec.to_xml()


def task_scene_config(robot: str = "fr3") -> SceneConfig:
    return SceneConfig(robot=robot, n_cubes=N_CUBES, cube_size=CUBE_SIZE)


class TaskSimulator(Simulator):
    """`Simulator` running one task: its scene, its seeded layout, the sliding target."""

    def __init__(self, task: str, seed: int = 0, robot: str = "fr3",
                 servo_feedforward: bool = SIM_SERVO_FEEDFORWARD):  # fmt: skip
        self.task = check_task(task)
        self.setup: EpisodeSetup | None = None
        self._slide_start = 0.0
        super().__init__(replace(task_scene_config(robot), servo_feedforward=servo_feedforward))
        # The zone marker is a world geom without joints or actuators: every qpos/ctrl index the
        # Simulator computed stays valid for the recompiled model.
        self.xml = add_zone_marker(self.xml)
        self.model = mujoco.MjModel.from_xml_string(self.xml)
        self.data = mujoco.MjData(self.model)
        self.reader = SceneReader(self.model, scene_colours())
        self.randomize(seed)

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        if getattr(self, "reader", None) is not None:  # the task layout, once fully built
            self._apply_setup(self.setup or make_setup(self.task, self._seed))

    def randomize(self, seed: int) -> None:
        """New episode: home pose, open gripper, the task's layout for `seed`; sim time and the
        /clock derived from it keep running."""
        now = self.data.time
        self.setup = make_setup(self.task, seed)
        self.reset(seed)
        self.data.time = now
        self._slide_start = now
        mujoco.mj_forward(self.model, self.data)

    def _apply_setup(self, setup: EpisodeSetup) -> None:
        for colour in setup.colours:
            adr = self.model.joint(f"cube_{colour}").qposadr[0]
            vadr = self.model.joint(f"cube_{colour}").dofadr[0]
            yaw = setup.yaws[colour]
            self.data.qpos[adr : adr + 3] = setup.positions[colour]
            self.data.qpos[adr + 3 : adr + 7] = [math.cos(yaw / 2), 0, 0, math.sin(yaw / 2)]
            self.data.qvel[vadr : vadr + 6] = 0.0
        mujoco.mj_forward(self.model, self.data)

    def step(self, n: int = 1) -> None:
        setup = self.setup
        if setup is None or setup.task != "dynamic_reach":
            super().step(n)
            return
        # The target is moved kinematically every physics step (a contact cannot stop it).
        joint = self.model.joint(setup.target_body)
        adr, vadr = joint.qposadr[0], joint.dofadr[0]
        start = setup.positions[setup.target][:2]
        for _ in range(n):
            t = self.data.time + self.dt - self._slide_start
            self.data.qpos[adr : adr + 2] = slide_position(start, setup.slide_velocity, t)
            self.data.qpos[adr + 2] = HALF
            yaw = setup.yaws[setup.target]
            self.data.qpos[adr + 3 : adr + 7] = [math.cos(yaw / 2), 0, 0, math.sin(yaw / 2)]
            self.data.qvel[vadr : vadr + 6] = 0.0
            self.data.qvel[vadr : vadr + 2] = slide_velocity(start, setup.slide_velocity, t)
            super().step(1)

    def snapshot(self) -> SceneSnapshot:
        return self.reader.snapshot(self.data.qpos)

    def success(self) -> bool:
        return is_success(self.setup, self.snapshot())
