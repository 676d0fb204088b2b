"""What the cameras say about the workcell: calibrated cameras (intrinsics and hand-eye), the
cubes they see located on the table and tracked over time, and the task's success judged from
those estimates and the arm's own joint readings.

Nothing here reads the simulator: the collector and its expert get from this module only what
a real robot's cameras and joint encoders give. The simulator's truth is read elsewhere, by the
referee that measures this module's errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vla_runtime.core.calibration_files import load_static_transform
from vla_runtime.core.cube_perception import (
    Camera,
    Sighting,
    blob_pixels_near,
    fuse,
    hue_deg,
    sightings,
)
from vla_runtime.core.hand_eye import rotation_from_xyzw
from vla_runtime.core.kinematics import chain_for
from vla_runtime.drivers.cameras import load_calibration
from vla_runtime.sim.tasks import (
    CUBE_SIZE,
    HALF,
    LIFT_HEIGHT,
    TOUCH_RADIUS,
    ZONE_CENTRE,
    ZONE_HALF,
)
from vla_runtime.sim.workcell import COLOURS

# How fast a cube's position may drift unseen (m/s): a resting cube does not move, but one the
# arm touches can, so an old estimate is trusted less than a fresh sighting.
DRIFT_M_PER_S = 0.03
# A sighting this far (and this many sigma) from the track means the cube was moved: start again.
MOVED_M = 0.006
MOVED_SIGMA = 4.0
POSITION_FLOOR_M = 0.0005  # no estimate is better than this (calibration error)
# Fingers closed on a cube (m of width): across its faces, or up to across its diagonal.
HELD_WIDTH = (CUBE_SIZE - 0.006, CUBE_SIZE * math.sqrt(2.0) + 0.002)
IN_HAND = "in_hand"  # PerceivedScene.visible's entry of the colours between the fingers


def transform(translation, rotation_xyzw) -> np.ndarray:
    matrix = np.eye(4)
    matrix[:3, :3] = rotation_from_xyzw(rotation_xyzw)
    matrix[:3, 3] = translation
    return matrix


@dataclass(frozen=True)
class MountedCamera:
    """One camera's calibration: on the base (eye-to-hand) or on the flange (eye-in-hand)."""

    name: str  # the image topic's camera name
    calibration: object  # CameraCalibration at the calibrated size
    parent_camera: np.ndarray  # T_parent_optical
    on_flange: bool


class CameraRig:
    """The calibrated cameras of a robot, from `vla-runtime calibrate` results: `<calib>.yaml`
    (camera_info) and `<calib>_extrinsics.yaml` (parent -> optical frame); a parent other than
    the base frame is the flange, whose pose comes from the arm's forward kinematics."""

    def __init__(self, calibration_dir: str | Path, cameras: dict[str, str], robot: str = "fr3"):
        """`cameras`: image topic name -> calibration file stem (e.g. scene_hd -> scene)."""
        directory = Path(calibration_dir)
        self.chain = chain_for(robot)
        self.cameras: dict[str, MountedCamera] = {}
        for name, stem in cameras.items():
            intrinsics = directory / f"{stem}.yaml"
            extrinsics = directory / f"{stem}_extrinsics.yaml"
            missing = [str(p) for p in (intrinsics, extrinsics) if not p.exists()]
            if missing:
                raise FileNotFoundError(
                    f"camera {name!r} is not calibrated: {', '.join(missing)} missing "
                    "(vla-runtime calibrate intrinsics|hand-eye)"
                )
            static = load_static_transform(extrinsics)
            on_flange = not static.parent.endswith(("link0", "base", "base_link"))
            self.cameras[name] = MountedCamera(
                name, load_calibration(intrinsics),
                transform(static.translation, static.rotation), on_flange,
            )  # fmt: skip

    def flange(self, arm_q) -> np.ndarray:
        return self.chain.joint_frames(np.asarray(arm_q, float))[self.chain.dof]

    def camera(self, name: str, image_shape, arm_q) -> Camera:
        """The camera `name` for an image of `image_shape` taken with the arm at `arm_q`."""
        mounted = self.cameras[name]
        height, width = image_shape[:2]
        pose = mounted.parent_camera
        if mounted.on_flange:
            pose = self.flange(arm_q) @ pose
        return Camera(mounted.calibration.scaled_to(width, height), pose)


@dataclass
class CubeTrack:
    position: np.ndarray  # xyz of the resting centre
    covariance: np.ndarray  # 2x2 of x, y
    stamp: float  # of the newest sighting
    sightings: int = 1
    cameras: set = field(default_factory=set)
    yaw: float | None = None  # modulo 90 degrees, when a camera looked down on it
    yaw_pixels: int = 0  # the size of the blob the yaw was read from

    @property
    def sigma_m(self) -> float:
        return float(math.sqrt(max(np.linalg.eigvalsh(self.covariance).max(), 0.0)))


class CubeTracker:
    """Per colour, a Kalman estimate of the cube's resting position on the table, started
    again when a sighting shows the cube has moved."""

    def __init__(self) -> None:
        self.tracks: dict[str, CubeTrack] = {}

    def update(self, colour: str, seen: list[Sighting], stamp: float) -> CubeTrack:
        position, covariance = fuse(seen)
        covariance = covariance + np.eye(2) * POSITION_FLOOR_M**2
        cameras = {s.camera for s in seen}
        views = [(s.pixels, s.yaw) for s in seen if s.yaw is not None]
        view = max(views, key=lambda v: v[0]) if views else None
        track = self.tracks.get(colour)
        if track is not None:
            age = max(stamp - track.stamp, 0.0)
            prior = track.covariance + np.eye(2) * (DRIFT_M_PER_S**2) * age
            innovation = position[:2] - track.position[:2]
            combined = prior + covariance
            distance = float(np.linalg.norm(innovation))
            mahalanobis = float(np.sqrt(innovation @ np.linalg.solve(combined, innovation)))
            if distance < MOVED_M or mahalanobis < MOVED_SIGMA:
                gain = prior @ np.linalg.inv(combined)
                xy = track.position[:2] + gain @ innovation
                track.position = np.array([xy[0], xy[1], position[2]])
                track.covariance = (np.eye(2) - gain) @ prior
                track.stamp = stamp
                track.sightings += 1
                track.cameras |= cameras
                # The closest view's yaw holds until a comparable view reads it again.
                if view is not None and view[0] >= 0.7 * track.yaw_pixels:
                    track.yaw_pixels, track.yaw = view
                return track
        track = CubeTrack(position, covariance, stamp, 1, cameras)
        if view is not None:
            track.yaw_pixels, track.yaw = view
        self.tracks[colour] = track
        return track

    def forget(self, colour: str) -> None:
        self.tracks.pop(colour, None)


@dataclass
class PerceivedScene:
    """The scene as the cameras and joint encoders show it at one instant."""

    stamp: float
    tcp: np.ndarray  # by the arm's kinematics from the joint readings
    gripper_width: float
    cubes: dict[str, CubeTrack]
    visible: dict[str, dict[str, int]]  # camera -> colour -> blob pixels this frame


class ScenePerception:
    """Cameras + joint readings -> `PerceivedScene`, updated frame by frame."""

    def __init__(self, rig: CameraRig, colours):
        self.rig = rig
        self.hues = {c: hue_deg(COLOURS[c]) for c in colours}
        self.tracker = CubeTracker()
        self.held: str | None = None  # a cube in the hand moves with it: no table estimate

    def tcp(self, arm_q) -> np.ndarray:
        """The TCP's position by the arm's kinematics (no camera involved)."""
        return self.rig.chain.tcp_position(np.asarray(arm_q, float)).copy()

    def _in_hand(self, image, camera: Camera, tcp: np.ndarray) -> dict[str, int]:
        """Per colour, pixels around the fingertips in a flange camera's image, where a held
        cube is: counted only when they cover a quarter of a cube's image there."""
        depth = float(np.linalg.norm(tcp - camera.origin))
        radius = 0.75 * camera.K[0, 0] * CUBE_SIZE / depth
        enough = 0.25 * (camera.K[0, 0] * CUBE_SIZE / depth) ** 2
        counts = {
            c: blob_pixels_near(image, hue, camera, tcp, radius) for c, hue in self.hues.items()
        }
        return {c: n for c, n in counts.items() if n >= enough}

    def update(self, images: dict, arm_q, gripper_width: float, stamp: float,
               camera_stamps: dict | None = None) -> PerceivedScene:  # fmt: skip
        """`images`: camera -> RGB image, all taken with the arm at `arm_q` (a camera on the
        flange whose image is older than `stamp` by more than 5 ms is left out: its pose is
        not known well enough)."""
        camera_stamps = camera_stamps or {}
        tcp = self.tcp(arm_q)
        seen: dict[str, list[Sighting]] = {}
        visible: dict[str, dict[str, int]] = {}
        for name, image in images.items():
            mounted = self.rig.cameras[name]
            taken = camera_stamps.get(name, stamp)
            if mounted.on_flange and abs(taken - stamp) > 0.005:
                continue
            camera = self.rig.camera(name, image.shape, arm_q)
            found = sightings(image, camera, name, self.hues, CUBE_SIZE, taken, mounted.on_flange)
            visible[name] = {c: s.pixels for c, s in found.items()}
            if mounted.on_flange:
                visible[IN_HAND] = self._in_hand(image, camera, tcp)
            for colour, sighting in found.items():
                if colour != self.held:
                    seen.setdefault(colour, []).append(sighting)
        for colour, group in seen.items():
            self.tracker.update(colour, group, stamp)
        return PerceivedScene(stamp, tcp, float(gripper_width), dict(self.tracker.tracks), visible)


@dataclass(frozen=True)
class Label:
    """A success judgement from perception, with how sure it is (0.5: a coin toss)."""

    success: bool
    confidence: float
    detail: dict = field(default_factory=dict)


def _certainty(margin_m: float, sigma_m: float) -> float:
    """P(the sign of `margin` is right) for a Gaussian error of `sigma` on it."""
    return 0.5 * (1.0 + math.erf(abs(margin_m) / (math.sqrt(2.0) * max(sigma_m, 1e-4))))


def judge(task: str, target: str, scene: PerceivedScene) -> Label:
    """The task's success detector on perceived state: reach, the TCP within touching distance
    of the cube; push, the cube's centre inside the zone; pick, the fingers closed on a
    cube-sized object of the target's colour, lifted off the table."""
    track = scene.cubes.get(target)
    if task in ("reach", "dynamic_reach"):
        if track is None:
            return Label(False, 0.5, {"why": "target never seen"})
        distance = float(np.linalg.norm(scene.tcp - track.position))
        sigma = math.hypot(track.sigma_m, 0.002)  # the kinematics' TCP error
        margin = TOUCH_RADIUS - distance
        return Label(margin >= 0, _certainty(margin, sigma), {"tcp_to_target_m": distance})
    if task == "push":
        if track is None:
            return Label(False, 0.5, {"why": "target never seen"})
        offset = np.abs(track.position[:2] - np.array(ZONE_CENTRE))
        margin = ZONE_HALF - float(offset.max())
        return Label(margin >= 0, _certainty(margin, track.sigma_m), {"zone_margin_m": margin})
    if task == "pick":
        lift = float(scene.tcp[2]) - HALF
        width = scene.gripper_width
        closed_on_cube = HELD_WIDTH[0] <= width <= HELD_WIDTH[1]
        seen_in_hand = scene.visible.get(IN_HAND, {}).get(target, 0)
        held = closed_on_cube and seen_in_hand > 0
        lifted = lift - LIFT_HEIGHT
        if not held:
            # Open fingers or nothing of the target's colour between them: a clear failure,
            # unless the width is within a millimetre of the held range.
            edge = min(abs(width - HELD_WIDTH[0]), abs(width - HELD_WIDTH[1]))
            confidence = 0.99 if seen_in_hand == 0 or edge > 0.001 else 0.7
            return Label(False, confidence, {"width_m": width, "in_hand_px": seen_in_hand})
        # The held cube hangs within a centimetre of the TCP: its lift is the TCP's.
        return Label(lifted >= 0, _certainty(lifted, 0.006),
                     {"lift_m": lift, "width_m": width, "in_hand_px": seen_in_hand})  # fmt: skip
    raise ValueError(task)
