"""`vla-runtime calibrate intrinsics|hand-eye|latency`: camera and timing calibration.

With --sim each procedure runs in MuJoCo against ground truth (the renderer's pinhole model,
MuJoCo's camera and body frames, an injected camera delay) and reports its errors; results go
to --out (default calibration/sim/, so simulated figures never stand in for real hardware's).
Without --sim a procedure says what it needs on real hardware.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from rclpy.qos import qos_profile_sensor_data
from scipy.spatial.transform import Rotation
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

from vla_runtime.core import topics
from vla_runtime.core.calibration_files import (
    StaticTransform,
    camera_info_yaml,
    latency_yaml,
)
from vla_runtime.core.camera_calibration import CameraCalibration, resample_intrinsics
from vla_runtime.core.charuco import (
    BoardSpec,
    board_pose,
    calibrate_intrinsics,
    detect_corners,
    transform,
)
from vla_runtime.core.hand_eye import (
    EYE_IN_HAND,
    EYE_TO_HAND,
    calibrate_hand_eye,
    pose_error,
    quaternion_xyzw,
)
from vla_runtime.core.help_text import CommandParser
from vla_runtime.core.kinematics import FRANKA, solve_ik
from vla_runtime.core.latency import (
    LatencyMeasurement,
    image_change,
    match_receipts,
    stack_parameters,
    summary,
)
from vla_runtime.core.robot import load_robot
from vla_runtime.ros.messages import image_from_msg, joint_state_values, to_seconds
from vla_runtime.sim.calibration_scene import CalibrationScene
from vla_runtime.stack.sim_harness import STARTUP_TIMEOUT_S, STEP_TIMEOUT_S, SimStack, sim_stack

SIM_OUT = "calibration/sim"
# The frames the transforms hang from, as franka_description names them.
FLANGE_FRAME = "fr3_link8"
BASE_FRAME = "fr3_link0"
HARDWARE = {
    "intrinsics": "real cameras: run `ros2 run camera_calibration cameracalibrator` on a "
                  "printed ChArUco board (core/charuco.BoardSpec) and save the result as "
                  "calibration/<camera>.yaml; only --sim runs here",
    "hand-eye": "real arms: record joint states and wrist/scene camera images of a ChArUco board "
                "at 15-25 poses (board on the table: eye-in-hand; on the flange: eye-to-hand); "
                "only --sim runs here",
    "latency": "real hardware: timing a real arm needs its driver's command path and a camera "
               "that sees it move; only --sim runs here",
}  # fmt: skip


# ---------------------------------------------------------------- view planning


def _random_rotation(rng: np.random.Generator, tilt_deg: tuple[float, float], roll_deg: float):
    """A board orientation facing the camera: tilted about an axis in the image plane, rolled
    about the optical axis."""
    axis_angle = rng.uniform(0, 2 * math.pi)
    axis = np.array([math.cos(axis_angle), math.sin(axis_angle), 0.0])
    tilt = math.radians(rng.uniform(*tilt_deg))
    roll = math.radians(rng.uniform(-roll_deg, roll_deg))
    return (Rotation.from_rotvec(axis * tilt) * Rotation.from_rotvec([0, 0, roll])).as_matrix()


def plan_board_views(
    K: np.ndarray, width: int, height: int, board: BoardSpec, n: int, seed: int
) -> list[np.ndarray]:
    """n poses T_camera_board that keep the whole board inside the image, at depths where it
    spans 45-85 % of the image height, tilted 10-40 degrees: what a careful calibration dataset
    looks like (tilts constrain the focal length, spread positions the principal point)."""
    rng = np.random.default_rng(seed)
    board_w, board_h = board.printed_size_m
    centre = np.array([board_w / 2 - board.margin_squares * board.square_m,
                       board_h / 2 - board.margin_squares * board.square_m, 0.0])  # fmt: skip
    outline = np.array([[x, y, 0.0] for x in (0, board_w) for y in (0, board_h)])
    outline -= board.margin_squares * board.square_m * np.array([1, 1, 0])
    views = []
    while len(views) < n:
        R = _random_rotation(rng, (10.0, 40.0), 30.0)
        depth = board_h * K[1, 1] / (height * rng.uniform(0.45, 0.85))
        pixel = rng.uniform([0.3 * width, 0.3 * height], [0.7 * width, 0.7 * height])
        ray = np.linalg.solve(K, [pixel[0], pixel[1], 1.0])
        T = transform(R, ray * depth - R @ centre)
        points = (T[:3, :3] @ outline.T).T + T[:3, 3]
        projected = (K @ points.T).T
        uv = projected[:, :2] / projected[:, 2:]
        if np.all(points[:, 2] > 0.05) and np.all((uv > 2) & (uv < [width - 3, height - 3])):
            views.append(T)
    return views


# ---------------------------------------------------------------- intrinsics


def sim_intrinsics(camera: str, size: int, render_scale: int, views: int, seed: int) -> dict:
    """Calibrate a sim camera from views rendered `render_scale` times larger than the `size`
    the stack publishes (square, as the stack renders: MuJoCo keeps fovy, so another aspect
    ratio is another camera); K is written for `size`. At 224 px the detector's corners carry
    ~0.25 px of bias-prone noise and f came out up to 1 % short; at 448 px within 0.15 %."""
    render = size * render_scale
    scene = CalibrationScene("free", render, render)
    try:
        truth_render = scene.intrinsics(camera)
        q = scene.home[: scene.arm_dof]
        scene.set_state(q)
        world_camera = scene.world_camera(camera)
        detections = []
        for T in plan_board_views(truth_render, render, render, scene.board, views, seed):
            scene.set_state(q, world_camera @ T)
            detection = detect_corners(scene.board, scene.render(camera))
            if detection is not None:
                detections.append(detection)
    finally:
        scene.close()
    result = calibrate_intrinsics(detections, render, render)
    K = resample_intrinsics(result.K, 1.0 / render_scale)
    truth = resample_intrinsics(truth_render, 1.0 / render_scale)
    errors = {
        name: float(K[i, j] / truth[i, j] - 1)
        for name, (i, j) in {"fx": (0, 0), "fy": (1, 1), "cx": (0, 2), "cy": (1, 2)}.items()
    }
    calibration = CameraCalibration(
        size, size, K=K, D=[float(v) for v in result.D], camera_name=camera
    )
    return {
        "camera": camera,
        "width": size,
        "height": size,
        "rendered_at": render,
        "views": result.views,
        "views_planned": views,
        "rms_px": result.rms_px,
        "K": K.tolist(),
        "D": result.D.tolist(),
        "truth_K": truth.tolist(),
        "relative_error": errors,
        "max_relative_error": max(abs(v) for v in errors.values()),
        "_calibration": calibration,
    }


# ---------------------------------------------------------------- hand-eye


def _eye_in_hand_poses(scene: CalibrationScene, n: int, rng) -> list[np.ndarray]:
    """Arm configurations from which the wrist camera sees the table board from varied places:
    the camera's optical axis aimed at a point near the board centre from 30-45 cm away,
    tilted up to 30 degrees off vertical and rolled about its axis."""
    board_centre = scene.world_board() @ np.array([*_board_centre(scene.board), 0.0, 1.0])
    flange_camera = np.linalg.inv(scene.flange(scene.home[:7])) @ scene.world_camera("wrist")
    return _aim_camera(scene, flange_camera, board_centre[:3], (0.3, 0.45), n, rng, down=True)


def _eye_to_hand_poses(scene: CalibrationScene, n: int, rng) -> list[np.ndarray]:
    """Arm configurations that show the flange board to the scene camera: the board's face
    turned towards the camera (30 degrees either way), at places across the workspace."""
    camera = scene.world_camera("scene")[:3, 3]
    home_flange = scene.flange(scene.home[:7])
    flange_board = np.linalg.inv(home_flange) @ scene.world_board()
    seed = scene.home[:7]
    poses = []
    for _ in range(400 * n):
        if len(poses) == n:
            break
        board_centre = rng.uniform([0.3, -0.2, 0.25], [0.55, 0.25, 0.5])
        towards = camera - board_centre
        towards /= np.linalg.norm(towards)
        # Board z points into the board: away from the camera, tilted and rolled at random.
        z = -towards
        R = _frame_with_z(z, rng.uniform(0, 2 * math.pi))
        R = Rotation.from_rotvec(_tilt(rng, 30.0)).as_matrix() @ R
        world_board = transform(R, board_centre)
        world_flange = world_board @ np.linalg.inv(flange_board)
        q = _reach(seed, world_flange)
        if q is not None:
            poses.append(q)
    return poses


def _board_centre(board: BoardSpec) -> tuple[float, float]:
    return board.squares_x * board.square_m / 2, board.squares_y * board.square_m / 2


def _tilt(rng, max_deg: float) -> np.ndarray:
    axis = rng.normal(size=3)
    return axis / np.linalg.norm(axis) * math.radians(rng.uniform(0, max_deg))


def _frame_with_z(z: np.ndarray, roll: float) -> np.ndarray:
    helper = np.array([1.0, 0, 0]) if abs(z[0]) < 0.9 else np.array([0, 1.0, 0])
    x = np.cross(helper, z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    R = np.column_stack([x, y, z])
    return R @ Rotation.from_rotvec([0, 0, roll]).as_matrix()


def _aim_camera(scene, flange_camera, target, distances, n, rng, down: bool):
    poses = []
    for _ in range(400 * n):
        if len(poses) == n:
            break
        off_vertical = math.radians(rng.uniform(0, 30))
        azimuth = rng.uniform(0, 2 * math.pi)
        direction = np.array([math.sin(off_vertical) * math.cos(azimuth),
                              math.sin(off_vertical) * math.sin(azimuth),
                              math.cos(off_vertical)])  # fmt: skip
        position = target + rng.uniform(*distances) * direction
        aim = target + rng.uniform(-0.04, 0.04, 3) * [1, 1, 0]
        z = aim - position
        z /= np.linalg.norm(z)
        R = _frame_with_z(z, rng.uniform(-math.pi, math.pi) if not down else rng.normal(0, 0.6))
        world_camera = transform(R, position)
        world_flange = world_camera @ np.linalg.inv(flange_camera)
        q = _reach(scene.home[:7], world_flange)
        if q is not None:
            poses.append(q)
    return poses


_LIMITS = load_robot("fr3")


def _reach(seed, world_flange: np.ndarray) -> np.ndarray | None:
    """Joint angles that put the flange at world_flange (base = world), within the joint
    limits less their margin; None when out of reach."""
    # solve_ik works on the TCP: carry the flange target through the fixed tool transform.
    tcp = world_flange @ FRANKA.tool
    q, error = solve_ik(FRANKA, seed, tcp[:3, 3], tcp[:3, :3], iterations=200)
    reached = FRANKA.tcp_pose(q)
    angle = np.linalg.norm(Rotation.from_matrix(reached[:3, :3].T @ tcp[:3, :3]).as_rotvec())
    lo = np.asarray(_LIMITS.position_min) + _LIMITS.position_margin
    hi = np.asarray(_LIMITS.position_max) - _LIMITS.position_margin
    if error > 1e-4 or angle > 1e-3 or np.any(q < lo) or np.any(q > hi):
        return None
    return q


def sim_hand_eye(kind: str, width: int, height: int, views: int, seed: int) -> dict:
    camera = "wrist" if kind == EYE_IN_HAND else "scene"
    scene = CalibrationScene("table" if kind == EYE_IN_HAND else "flange", width, height)
    rng = np.random.default_rng(seed)
    try:
        K = scene.intrinsics(camera)
        planner = _eye_in_hand_poses if kind == EYE_IN_HAND else _eye_to_hand_poses
        flanges, detections, boards = [], [], []
        for q in planner(scene, views, rng):
            scene.set_state(q)
            detection = detect_corners(scene.board, scene.render(camera))
            if detection is None:
                continue
            flanges.append(scene.flange(q))
            detections.append(detection)
            boards.append(board_pose(detection, K))
        q_true = scene.home[:7]
        scene.set_state(q_true)
        world_camera = scene.world_camera(camera)
        if kind == EYE_IN_HAND:
            truth = np.linalg.inv(scene.flange(q_true)) @ world_camera
        else:
            truth = world_camera  # the base is the world origin
    finally:
        scene.close()
    result = calibrate_hand_eye(kind, flanges, detections, boards, K)
    translation_error, rotation_error = pose_error(result.X, truth)
    parent = FLANGE_FRAME if kind == EYE_IN_HAND else BASE_FRAME
    extrinsics = StaticTransform(
        parent, f"{camera}_optical_frame", tuple(result.X[:3, 3]),
        tuple(quaternion_xyzw(result.X[:3, :3])),
    )  # fmt: skip
    return {
        "kind": kind,
        "camera": camera,
        "parent": parent,
        "child": extrinsics.child,
        "views": result.views,
        "views_planned": views,
        "rms_px": result.rms_px,
        "translation": list(extrinsics.translation),
        "rotation_xyzw": list(extrinsics.rotation),
        "truth_translation": truth[:3, 3].tolist(),
        "truth_rotation_xyzw": quaternion_xyzw(truth[:3, :3]),
        "translation_error_m": translation_error,
        "rotation_error_deg": rotation_error,
        "_extrinsics": extrinsics,
    }


# ---------------------------------------------------------------- latency


class _LatencyProbe:
    """Receipt times on the stack's client node: scene states, frames, joint states."""

    def __init__(self, stack: SimStack) -> None:
        self.stack = stack
        self.state_receipts: dict[float, float] = {}
        self.frames: dict[str, list[tuple[float, float, np.ndarray]]] = {
            c: [] for c in stack.cameras
        }
        self.joint_states: list[tuple[float, float, np.ndarray]] = []  # receipt, stamp, q
        node = stack.node
        node.create_subscription(
            Float64MultiArray, topics.SIM_SCENE_STATE, self._on_state, qos_profile_sensor_data
        )
        for camera in stack.cameras:
            node.create_subscription(
                Image, topics.camera_image(camera),
                lambda msg, c=camera: self._on_frame(c, msg), qos_profile_sensor_data,
            )  # fmt: skip
        node.create_subscription(JointState, topics.JOINT_STATES, self._on_joints, 50)
        self.joints = load_robot("fr3").joints

    def _on_state(self, msg) -> None:
        self.state_receipts[float(msg.data[0])] = time.monotonic()

    def _on_frame(self, camera: str, msg) -> None:
        received = time.monotonic()
        self.frames[camera].append((to_seconds(msg.header.stamp), received, image_from_msg(msg)))

    def _on_joints(self, msg) -> None:
        values = joint_state_values(msg, self.joints)
        if values is not None:
            q = np.asarray(values[0], dtype=float)
            self.joint_states.append((time.monotonic(), to_seconds(msg.header.stamp), q))


def sim_latency(
    camera_delays: dict[str, str], steps: int, image_size: int, frames: int
) -> LatencyMeasurement:
    """Run the sim stack's driver and cameras in real time (each camera with its
    `injected_delay`), measure every camera's state -> frame receipt latency over `frames`
    frames, then send `steps` small joint steps on the arm's command topic and time the first
    joint state and the first wrist frame that show the motion."""
    parameters = {f"{c}_camera": {"injected_delay": d} for c, d in camera_delays.items()}
    stack = SimStack(sim_stack("", image_size, False, parameters=parameters))
    try:
        probe = _LatencyProbe(stack)
        stack.spin_until(
            lambda: all(len(f) >= frames for f in probe.frames.values()) and probe.joint_states,
            STARTUP_TIMEOUT_S, f"{frames} frames of every camera",
        )  # fmt: skip
        cameras = {
            c: summary(match_receipts(probe.state_receipts, [(s, r) for s, r, _ in f]))
            for c, f in probe.frames.items()
        }
        to_motion, to_image = [], {c: [] for c in probe.frames}
        for k in range(steps):
            motion, frames_seen = _time_step(stack, probe, STEP_RAD if k % 2 == 0 else -STEP_RAD)
            to_motion.append(motion)
            for camera, delay in frames_seen.items():
                to_image[camera].append(delay)
    finally:
        stack.close()
    return LatencyMeasurement(
        cameras=cameras,
        command_to_motion=summary(to_motion),
        command_to_image_motion={c: summary(v) for c, v in to_image.items()},
    )


def _time_step(stack: SimStack, probe: _LatencyProbe, step: float) -> tuple[float, dict]:
    """Command joint 1 `step` rad away; (sim s from command to the first moved joint state,
    {camera: wall s from command to the receipt of the first frame that changed})."""
    before = probe.joint_states[-1]
    q0 = before[2]
    frames_before = {c: len(f) for c, f in probe.frames.items()}
    last_frame = {c: f[-1][2] for c, f in probe.frames.items()}
    target = q0.copy()
    target[0] += step
    sent = time.monotonic()
    sent_sim = before[1] + (sent - before[0])  # the newest state's stamp + wall time since it came
    count = len(probe.joint_states)
    stack.send_command(target, load_robot("fr3").gripper_max_width)

    def first_moved():
        return next(
            (s for s in probe.joint_states[count:] if np.max(np.abs(s[2] - q0)) > ONSET_RAD), None
        )

    def first_changed(camera: str) -> float | None:
        for _, received, image in probe.frames[camera][frames_before[camera] :]:
            if image_change(image, last_frame[camera]) > ONSET_GREY:
                return received
        return None

    stack.spin_until(lambda: first_moved() is not None, STEP_TIMEOUT_S, "the arm to move")
    stack.spin_until(
        lambda: all(first_changed(c) is not None for c in probe.frames),
        STEP_TIMEOUT_S, "frames that show the motion",
    )  # fmt: skip
    settle = time.monotonic() + SETTLE_S
    stack.spin_until(lambda: time.monotonic() > settle, STEP_TIMEOUT_S, "the arm to settle")
    return first_moved()[1] - sent_sim, {c: first_changed(c) - sent for c in probe.frames}


STEP_RAD = 0.05  # joint 1: a step every camera sees, well inside the velocity limits
ONSET_RAD = 2e-4
ONSET_GREY = 1.0  # mean grey-level change of a frame that shows motion (renders are noise-free)
SETTLE_S = 0.3


# ---------------------------------------------------------------- command line


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _print(result: dict, as_json: bool) -> None:
    public = {k: v for k, v in result.items() if not k.startswith("_")}
    print(json.dumps(public) if as_json else json.dumps(public, indent=2))


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="vla-runtime calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="procedure", required=True, metavar="PROCEDURE")
    common = CommandParser(add_help=False)
    common.add_argument("--sim", action="store_true", help="calibrate the MuJoCo workcell")
    common.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    common.add_argument("--out", default=SIM_OUT, help=f"results folder (default {SIM_OUT})")
    common.add_argument("--seed", type=int, default=0, help="seed of the planned poses")
    one = sub.add_parser(
        "intrinsics",
        parents=[common],
        help="camera K and distortion from ChArUco views -> <camera>.yaml",
    )
    one.add_argument("--camera", choices=("scene", "wrist", "all"), default="all")
    one.add_argument("--size", type=int, default=224, help="published image size (square)")
    one.add_argument(
        "--render-scale",
        type=int,
        default=2,
        help="views rendered this many times larger (sim; corner accuracy)",
    )
    one.add_argument("--views", type=int, default=20)
    two = sub.add_parser(
        "hand-eye",
        parents=[common],
        help="wrist camera on the flange, scene camera in the base frame "
        "-> <camera>_extrinsics.yaml",
    )
    two.add_argument(
        "--camera",
        choices=("scene", "wrist", "all"),
        default="all",
        help="wrist: eye-in-hand; scene: eye-to-hand",
    )
    two.add_argument("--views", type=int, default=20)
    two.add_argument("--width", type=int, default=640)
    two.add_argument("--height", type=int, default=480)
    three = sub.add_parser(
        "latency",
        parents=[common],
        help="camera capture -> receipt and command -> motion -> latency.yaml and stack arguments",
    )
    three.add_argument("--scene-delay", default="", help="sim: injected scene camera delay (s)")
    three.add_argument("--wrist-delay", default="", help="sim: injected wrist camera delay (s)")
    three.add_argument("--steps", type=int, default=4, help="command steps to time")
    three.add_argument("--frames", type=int, default=40, help="frames per camera to time")
    three.add_argument("--image-size", type=int, default=224, help="the stack's image size")
    sub.add_parser(
        "scheduler",
        help="fit the compute scheduler's thresholds on recorded "
        "episodes (`calibrate scheduler --help`)",
        add_help=False,
    )
    return parser


def calibrate_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.sim:
        print(
            f"vla-runtime calibrate {args.procedure}: {HARDWARE[args.procedure]}", file=sys.stderr
        )
        return 2
    out = Path(args.out)
    cameras = ("scene", "wrist") if getattr(args, "camera", "all") == "all" else (args.camera,)
    results: dict = {"procedure": args.procedure, "sim": True, "out": str(out), "files": []}
    if args.procedure == "intrinsics":
        for camera in cameras:
            one = sim_intrinsics(camera, args.size, args.render_scale, args.views, args.seed)
            results["files"].append(
                _write(out / f"{camera}.yaml", camera_info_yaml(one.pop("_calibration")))
            )
            results[camera] = one
    elif args.procedure == "hand-eye":
        for camera in cameras:
            kind = EYE_IN_HAND if camera == "wrist" else EYE_TO_HAND
            one = sim_hand_eye(kind, args.width, args.height, args.views, args.seed)
            comment = (f"{kind.replace('_', '-')} calibration (vla-runtime calibrate hand-eye); "
                       f"{one['views']} views, {one['rms_px']:.3f} px rms")  # fmt: skip
            text = one.pop("_extrinsics").to_yaml(comment)
            results["files"].append(_write(out / f"{camera}_extrinsics.yaml", text))
            results[camera] = one
    else:
        delays = {"scene": args.scene_delay, "wrist": args.wrist_delay}
        measured = sim_latency(delays, args.steps, args.image_size, args.frames)
        arguments = stack_parameters(measured)
        doc = {
            "cameras": measured.cameras,
            "command_to_motion": measured.command_to_motion,
            "command_to_image_motion": measured.command_to_image_motion,
            "injected_camera_delays": {c: d for c, d in delays.items() if d},
            "stack_arguments": arguments,
        }
        results["files"].append(_write(out / "latency.yaml", latency_yaml(doc)))
        results.update(doc)
        results["launch_arguments"] = " ".join(f"{k}:={v}" for k, v in arguments.items())
    _print(results, args.json)
    return 0
