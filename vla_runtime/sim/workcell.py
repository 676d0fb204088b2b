"""The simulated workcell every robot shares: table, coloured cubes, light, the scene and the wrist
camera, and the scene's compile step (the home keyframe; the model rebuilt from its own MJCF).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from vla_runtime.core.gripper import opening_from_width
from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD

COLOURS: dict[str, tuple[float, float, float, float]] = {
    "red": (0.85, 0.1, 0.1, 1.0),
    "green": (0.1, 0.7, 0.2, 1.0),
    "blue": (0.1, 0.25, 0.85, 1.0),
    "yellow": (0.95, 0.85, 0.1, 1.0),
    "orange": (1.0, 0.5, 0.05, 1.0),
    "purple": (0.5, 0.15, 0.7, 1.0),
    "cyan": (0.1, 0.8, 0.85, 1.0),
    "magenta": (0.9, 0.2, 0.65, 1.0),
}
# Cube centres are drawn from this box in front of the robot (base frame, metres), well inside
# the FR3 reach, and kept at least CUBE_SPACING apart so they never start interpenetrating.
CUBE_REGION_X = (0.35, 0.65)
CUBE_REGION_Y = (-0.25, 0.25)
CUBE_SPACING = 0.08
CUBE_MASS = 0.05  # kg
CUBE_FRICTION = (1.0, 0.01, 0.001)  # sliding, torsional, rolling
TABLE_HALF_SIZE = (0.6, 0.8, 0.02)
TABLE_CENTRE_X = 0.35
FLOOR_Z = -0.75
GRIPPER_ACTUATOR = "hand"  # every robot's gripper actuator, a spring on the fingers' tendon
SERVO_FEEDFORWARD = "servo_feedforward"  # a model numeric: the arm's servo is fed forward
TCP_SITE = "tcp"  # every robot's TCP, the fingertips' centre, a site on its "hand" body
GRIPPER_OPEN_CTRL = 255.0  # the franky-sim "hand" actuator: 0 closed .. 255 fully open
# The hand squeezes what it closes on with this force per finger (N): the grasp force the real
# drivers command (core/gripper_intent.py's default). The franky-sim spring (100 N/m on the mean
# opening) squeezed a 4 cm cube with 1 N when fully closed and with a tenth of that when told
# 3 cm, so grasps a real hand holds slipped in simulation.
GRASP_FORCE = 20.0
HAND_STIFFNESS = 2000.0  # N/m on the mean opening: a 1 cm shortfall already reaches the force
HAND_DAMPING = 60.0  # N s/m: about critical with the fingers' armature


@dataclass(frozen=True)
class SceneConfig:
    robot: str = "fr3"
    n_cubes: int = 4
    seed: int = 0
    cube_size: float = 0.04
    colours: tuple[str, ...] = tuple(COLOURS)
    cameras: tuple[str, ...] = ("scene", "wrist")
    scene_fovy_deg: float = 50.0
    wrist_fovy_deg: float = 75.0
    max_render_size: int = 1280
    # Offscreen multisampling doubles the scene camera's software-rendering cost (EGL on CPU)
    # for antialiasing that is barely visible at policy resolutions (224 px).
    offscreen_samples: int = 0
    # Feed the arm's position servo the setpoint's velocity (sim/simulator.py), as a robot's
    # joint controller does. Off by default: the shipped checkpoints were trained on the servo
    # without it, which lags a moving setpoint by 0.1 s, and with it their pick success fell
    # from 14 to 9-10 of 20 through the product path.
    servo_feedforward: bool = SIM_SERVO_FEEDFORWARD


def cube_names(config: SceneConfig) -> list[str]:
    return [f"cube_{c}" for c in config.colours[: config.n_cubes]]


def cube_poses(n_cubes: int, seed: int, cube_size: float = 0.04) -> list[tuple[np.ndarray, ...]]:
    """Seeded, non-overlapping resting poses [(pos xyz, quat wxyz)] for `n_cubes` cubes."""
    rng = np.random.default_rng(seed)
    centres: list[np.ndarray] = []
    poses = []
    for _ in range(n_cubes):
        for _attempt in range(1000):
            xy = rng.uniform(
                [CUBE_REGION_X[0], CUBE_REGION_Y[0]], [CUBE_REGION_X[1], CUBE_REGION_Y[1]]
            )
            if all(np.linalg.norm(xy - c) >= CUBE_SPACING for c in centres):
                break
        else:
            raise ValueError(f"cannot place {n_cubes} cubes {CUBE_SPACING} m apart")
        centres.append(xy)
        yaw = rng.uniform(-math.pi, math.pi)
        quat = np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])
        poses.append((np.array([xy[0], xy[1], cube_size / 2]), quat))
    return poses


def _look_at_quat(pos, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Orientation of a MuJoCo camera (looks along -z, y up) at `pos` looking at `target`."""
    forward = np.asarray(target, float) - np.asarray(pos, float)
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    cam_up = np.cross(right, forward)
    rotation = np.column_stack([right, cam_up, -forward])
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, rotation.flatten())
    return quat


def configure_spec(spec: mujoco.MjSpec, config: SceneConfig) -> None:
    """1 kHz physics with sleeping cubes, cheap offscreen rendering, and the servo recorded in
    the model (SERVO_FEEDFORWARD), so that whoever simulates the published scene, the safety
    node's rollout, moves the arm as the driver does."""
    spec.option.timestep = 0.001
    if config.servo_feedforward:
        spec.add_numeric(name=SERVO_FEEDFORWARD, data=[1.0])
    # Resting cubes sleep (no contact solving) until something awake touches them: this halves
    # the cost of a physics step with four cubes on the table.
    spec.option.enableflags |= mujoco.mjtEnableBit.mjENBL_SLEEP
    # Rendering speed: no shadow maps, no reflections; offscreen buffers large enough for cameras.
    spec.visual.quality.shadowsize = 0
    spec.visual.quality.offsamples = config.offscreen_samples
    spec.visual.global_.offwidth = config.max_render_size
    spec.visual.global_.offheight = config.max_render_size
    for material in spec.materials:
        material.reflectance = 0.0


def add_workcell(spec: mujoco.MjSpec, config: SceneConfig) -> list[tuple[np.ndarray, ...]]:
    """Light, floor, table, the seeded cubes and the cameras (the wrist camera on the body named
    "hand"), the same for every robot. Returns the cube poses."""
    if not 0 <= config.n_cubes <= len(config.colours):
        raise ValueError(f"n_cubes must be 0..{len(config.colours)}, got {config.n_cubes}")
    world = spec.worldbody
    light = world.add_light(name="sun", pos=[0.5, 0.0, 2.0], dir=[0.0, 0.0, -1.0])
    light.castshadow = False
    light.diffuse = [0.7, 0.7, 0.7]
    world.add_geom(
        name="floor",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[3.0, 3.0, 0.1],
        pos=[0.0, 0.0, FLOOR_Z],
        rgba=[0.35, 0.35, 0.38, 1.0],
    )
    world.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=list(TABLE_HALF_SIZE),
        pos=[TABLE_CENTRE_X, 0.0, -TABLE_HALF_SIZE[2]],
        rgba=[0.62, 0.48, 0.33, 1.0],
    )

    half = config.cube_size / 2
    poses = cube_poses(config.n_cubes, config.seed, config.cube_size)
    for name, colour, (pos, quat) in zip(cube_names(config), config.colours, poses, strict=False):
        body = world.add_body(name=name, pos=pos.tolist(), quat=quat.tolist())
        body.add_freejoint(name=name)
        body.add_geom(
            name=name,
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=[half, half, half],
            rgba=list(COLOURS[colour]),
            mass=CUBE_MASS,
            friction=list(CUBE_FRICTION),
        )

    if "scene" in config.cameras:
        pos = [1.3, 0.6, 0.95]
        world.add_camera(
            name="scene",
            pos=pos,
            quat=_look_at_quat(pos, [0.35, 0.0, 0.28]).tolist(),
            fovy=config.scene_fovy_deg,
        )
    if "wrist" in config.cameras:
        # Mounted on the hand behind the fingers, offset sideways, looking along the approach
        # axis (+z of the hand; a camera looks along its own -z) and tilted to the fingertips.
        hand = spec.body("hand")
        pos = [-0.09, 0.0, 0.02]
        hand.add_camera(
            name="wrist",
            pos=pos,
            quat=_look_at_quat(pos, [0.0, 0.0, 0.2], up=(-1, 0, 0)).tolist(),
            fovy=config.wrist_fovy_deg,
        )
    return poses


def add_tcp_site(hand, offset: float) -> None:
    """The TCP `offset` along the hand body's approach axis (+z); never rendered (group 4)."""
    hand.add_site(name=TCP_SITE, pos=[0.0, 0.0, offset], size=[0.002, 0.002, 0.002], group=4,
                  rgba=[0.0, 0.0, 0.0, 0.0])  # fmt: skip


def configure_hand(actuator, max_width: float) -> None:
    """The gripper actuator (on the fingers' tendon, whose length is the mean opening) as a
    position servo: ctrl 0..GRIPPER_OPEN_CTRL maps to an opening 0..max_width / 2, its force
    capped at GRASP_FORCE per finger (the tendon splits its force between the two)."""
    actuator.gainprm[0] = HAND_STIFFNESS * opening_from_width(max_width) / GRIPPER_OPEN_CTRL
    actuator.biasprm[:3] = [0.0, -HAND_STIFFNESS, -HAND_DAMPING]
    actuator.biastype = mujoco.mjtBias.mjBIAS_AFFINE
    actuator.ctrlrange = [0.0, GRIPPER_OPEN_CTRL]
    actuator.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
    actuator.forcerange = [-2 * GRASP_FORCE, 2 * GRASP_FORCE]
    actuator.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE


def gripper_ctrl_per_opening(model: mujoco.MjModel) -> float:
    """The gripper actuator's ctrl per metre of one finger's opening: a spring on the tendon of
    the mean finger opening, gain * ctrl = stiffness * opening at rest."""
    actuator = model.actuator(GRIPPER_ACTUATOR).id
    gain = float(model.actuator_gainprm[actuator, 0])
    stiffness = -float(model.actuator_biasprm[actuator, 1])
    return stiffness / gain


def compile_scene(
    spec: mujoco.MjSpec, home: list[float], poses, gripper_width: float
) -> tuple[mujoco.MjModel, str]:
    """Add the home keyframe (arm home, gripper open, cubes at their poses) and compile."""
    finger = opening_from_width(gripper_width)
    qpos = [*home, finger, finger]
    for pos, quat in poses:
        qpos += [*pos.tolist(), *quat.tolist()]
    spec.add_key(name="home", qpos=qpos, ctrl=[*home, GRIPPER_OPEN_CTRL])
    spec.compile()  # validates the spec; errors name the offending element
    xml = spec.to_xml()
    # MJCF text rounds numbers, so the model is compiled from the text itself: the driver and the
    # camera processes then simulate and render exactly the same model.
    return mujoco.MjModel.from_xml_string(xml), xml
