"""Camera frame sources (no ROS): an OpenCV device, a looping video file, the simulator.

Every source has the same small surface: `open()` (raises `CameraUnavailable` with a reason),
`read() -> (ok, frame_rgb)` with an HxWx3 uint8 RGB frame, `close()`, and `fps` (the source's
own frame rate, None when it does not know), and `has_clock` for the OpenCV ones. Pacing is
the caller's job (drivers/camera_capture.py).

Also: the ROS camera_info YAML calibration loader and the helpers that size published frames.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import cv2
import numpy as np
import yaml

from vla_runtime.core.camera_calibration import CameraCalibration
from vla_runtime.sim.render import SceneRenderer


class CameraUnavailable(RuntimeError):
    """The camera cannot be opened or has stopped delivering frames."""


class CalibrationError(ValueError):
    """A calibration file is missing, malformed or inconsistent."""


# ---------------------------------------------------------------- output size


def output_size(native: tuple[int, int], width: int, height: int) -> tuple[int, int]:
    """(width, height) to publish: 0 for both keeps the native size, 0 for one keeps the
    native aspect ratio."""
    native_w, native_h = native
    if width < 0 or height < 0:
        raise ValueError(f"width/height must be >= 0, got {width}x{height}")
    if width == 0 and height == 0:
        return native_w, native_h
    if width == 0:
        width = max(1, round(native_w * height / native_h))
    elif height == 0:
        height = max(1, round(native_h * width / native_w))
    return width, height


def resize_frame(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize with INTER_AREA (no aliasing when shrinking); a no-op at the same size."""
    if frame.shape[1] == width and frame.shape[0] == height:
        return frame
    return cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA)


# ---------------------------------------------------------------- calibration


def _matrix(doc: dict, key: str, rows: int, cols: int, path: Path) -> np.ndarray | None:
    entry = doc.get(key)
    if entry is None:
        return None
    if not isinstance(entry, dict) or "data" not in entry:
        raise CalibrationError(f"{path}: '{key}' must be a mapping with rows, cols and data")
    data = entry["data"]
    if not isinstance(data, list):
        raise CalibrationError(f"{path}: '{key}.data' must be a list")
    declared = (int(entry.get("rows", rows)), int(entry.get("cols", cols)))
    if rows and declared != (rows, cols):
        raise CalibrationError(f"{path}: '{key}' must be {rows}x{cols}, file says {declared}")
    if len(data) != declared[0] * declared[1]:
        raise CalibrationError(
            f"{path}: '{key}' declares {declared[0]}x{declared[1]} but has {len(data)} values"
        )
    try:
        values = np.asarray(data, dtype=float)
    except (TypeError, ValueError) as exc:
        raise CalibrationError(f"{path}: '{key}' has non-numeric values") from exc
    if not np.all(np.isfinite(values)):
        raise CalibrationError(f"{path}: '{key}' has non-finite values")
    return values.reshape(declared)


def load_calibration(path: str | os.PathLike) -> CameraCalibration:
    """Read a ROS camera_info YAML file (camera_calibration / camera_info_manager format)."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise CalibrationError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise CalibrationError(f"{path}: expected a mapping at the top level")
    try:
        width, height = int(doc["image_width"]), int(doc["image_height"])
    except KeyError as exc:
        raise CalibrationError(f"{path}: missing {exc.args[0]}") from exc
    except (TypeError, ValueError) as exc:
        raise CalibrationError(f"{path}: image_width/image_height must be integers") from exc
    if width <= 0 or height <= 0:
        raise CalibrationError(f"{path}: image size must be positive, got {width}x{height}")
    K = _matrix(doc, "camera_matrix", 3, 3, path)
    if K is None:
        raise CalibrationError(f"{path}: missing camera_matrix")
    D = _matrix(doc, "distortion_coefficients", 0, 0, path)
    R = _matrix(doc, "rectification_matrix", 3, 3, path)
    P = _matrix(doc, "projection_matrix", 3, 4, path)
    return CameraCalibration(
        width=width,
        height=height,
        K=K,
        D=[] if D is None else [float(v) for v in D.ravel()],
        R=np.eye(3) if R is None else R,
        P=P,
        distortion_model=str(doc.get("distortion_model", "plumb_bob")),
        camera_name=str(doc.get("camera_name", "")),
    )


# ---------------------------------------------------------------- sources


def _valid_fps(value: float) -> float | None:
    return float(value) if value and math.isfinite(value) and 0 < value < 1000 else None


class _OpenCVSource:
    """What the OpenCV sources share: BGR frames of `_capture` read as RGB, released on close.
    `has_clock`: whether the source delivers frames at its own rate (a device) or as fast as
    they are read (a file)."""

    has_clock = True

    _capture: cv2.VideoCapture | None  # set by the subclass: None until open()

    def _grab(self) -> tuple[bool, np.ndarray | None]:
        return self._capture.read()

    def read(self) -> tuple[bool, np.ndarray | None]:
        if self._capture is None:
            return False, None
        ok, frame = self._grab()
        if not ok or frame is None:
            return False, None
        return True, cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)

    def close(self) -> None:
        if self._capture is not None:
            self._capture.release()
            self._capture = None


class DeviceSource(_OpenCVSource):
    """A live camera through OpenCV: a V4L2 index ("0") or a device path ("/dev/video2")."""

    def __init__(self, device: str | int, fps: float | None = None) -> None:
        text = str(device).strip()
        self.device: str | int = int(text) if text.isdigit() else text
        self.requested_fps = fps
        self.fps: float | None = None
        self._capture = None

    def open(self) -> None:
        self.close()
        if isinstance(self.device, str) and not os.path.exists(self.device):
            raise CameraUnavailable(f"device {self.device} does not exist")
        capture = cv2.VideoCapture(self.device)
        if not capture.isOpened():
            capture.release()
            raise CameraUnavailable(f"cannot open camera device {self.device}")
        if self.requested_fps:
            capture.set(cv2.CAP_PROP_FPS, float(self.requested_fps))
        # Keep the driver queue short: stale buffered frames would add latency.
        capture.set(cv2.CAP_PROP_BUFFERSIZE, 1)
        self.fps = _valid_fps(capture.get(cv2.CAP_PROP_FPS))
        self._capture = capture


class VideoFileSource(_OpenCVSource):
    """A video file that starts over at its end, so it can stand in for a live camera."""

    has_clock = False

    def __init__(self, path: str | os.PathLike, loop: bool = True) -> None:
        self.path = Path(path)
        self.loop = loop
        self.fps: float | None = None
        self.frame_count = 0
        self._capture = None

    def open(self) -> None:
        self.close()
        if not self.path.is_file():
            raise CameraUnavailable(f"video file {self.path} does not exist")
        capture = cv2.VideoCapture(str(self.path))
        if not capture.isOpened():
            capture.release()
            raise CameraUnavailable(f"cannot decode video file {self.path}")
        ok, _ = capture.read()
        if not ok:
            capture.release()
            raise CameraUnavailable(f"video file {self.path} has no readable frames")
        capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
        self.fps = _valid_fps(capture.get(cv2.CAP_PROP_FPS))
        self.frame_count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self._capture = capture

    def _grab(self) -> tuple[bool, np.ndarray | None]:
        ok, frame = self._capture.read()
        if not ok and self.loop:
            # Reopen rather than seek: seeking is unreliable for some codecs and containers.
            self._capture.release()
            self._capture = cv2.VideoCapture(str(self.path))
            ok, frame = self._capture.read() if self._capture.isOpened() else (False, None)
        return ok, frame


class SimSource:
    """Renders one MJCF camera of the simulated scene at the newest state it was given.

    `update(sim_time, qpos)` stores the newest state; `read()` renders it (None: nothing new
    since the last read, or not due yet) and `frame_time` is the sim time of the state the last
    frame shows. With `fps` > 0 a frame is due at each multiple of 1/fps of the states' sim time
    (the first state at or after it: states arrive on their own grid); `render_next()` makes
    the next state due at once (a scene reset, whose first frame the policy is waiting for).
    `shows(sim_time, qpos)`: whether the last frame is of that very state.
    """

    def __init__(
        self, xml: str, camera: str, width: int, height: int, fps: float = 0.0, renderer_cls=None
    ) -> None:
        self.xml, self.camera, self.width, self.height = xml, camera, width, height
        self.fps = float(fps)
        self.frame_time: float | None = None
        self._renderer_cls = renderer_cls
        self._renderer = None
        self._state: tuple[float, np.ndarray] | None = None
        self._rendered_time: float | None = None
        self._rendered_qpos: np.ndarray | None = None
        self._next_time = -math.inf

    def render_next(self) -> None:
        self._next_time = -math.inf

    def _due(self, sim_time: float) -> bool:
        if self.fps <= 0.0:
            return True
        if self._rendered_time is not None and sim_time < self._rendered_time:
            self._next_time = -math.inf  # the sim restarted from 0: a new schedule
        if sim_time < self._next_time:
            return False
        period = 1.0 / self.fps
        # Due at the multiples of the period: every camera at this rate (or at a divisor of
        # it) renders the same states, so their frames carry the same stamps and pair up, even
        # when one of them saw an episode's reset a state later than another.
        self._next_time = (math.floor(sim_time / period + 1e-6) + 1) * period
        return True

    def open(self) -> None:
        self.close()
        renderer_cls = self._renderer_cls or SceneRenderer
        try:
            self._renderer = renderer_cls(self.xml, self.camera, self.width, self.height)
        except Exception as exc:  # a bad scene or camera name must not take the node down
            raise CameraUnavailable(f"cannot render sim camera '{self.camera}': {exc}") from exc

    def intrinsics(self) -> np.ndarray:
        if self._renderer is None:
            raise CameraUnavailable("sim camera is not open")
        return np.asarray(self._renderer.intrinsics(), dtype=float).reshape(3, 3)

    def update(self, sim_time: float, qpos: np.ndarray) -> None:
        self._state = (float(sim_time), np.asarray(qpos, dtype=float))

    def read(self) -> tuple[bool, np.ndarray | None]:
        if self._renderer is None or self._state is None:
            return False, None
        sim_time, qpos = self._state
        if sim_time == self._rendered_time or not self._due(sim_time):
            return False, None
        frame = self._renderer.render(qpos)
        self._rendered_time = self.frame_time = sim_time
        self._rendered_qpos = qpos
        return True, frame

    def shows(self, sim_time: float, qpos) -> bool:
        return (
            self._rendered_qpos is not None
            and float(sim_time) == self._rendered_time
            and np.array_equal(np.asarray(qpos, dtype=float), self._rendered_qpos)
        )

    def close(self) -> None:
        renderer, self._renderer = self._renderer, None
        close = getattr(renderer, "close", None)
        if close is not None:
            close()
