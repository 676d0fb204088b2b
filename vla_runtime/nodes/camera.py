"""Camera node: publishes one camera's frames as sensor_msgs/Image (rgb8) + CameraInfo.

Sources (parameter `source`):
- "device": an OpenCV/V4L2 camera (`device` = index or /dev path), read in a capture thread.
- "file": a video file (`path`) that loops, paced to its own fps, read in a capture thread.
- "sim": renders an MJCF camera of the simulated scene from /sim/scene_xml + /sim/scene_state,
  stamped with the sim time of the state it shows.

`fps` caps the publish rate; 0 (the default) means the source's own rate: the file's fps
(15 Hz for a file that does not state it), whatever the device delivers, and for sim a frame
of every scene state (in lock-step: one per step batch). Sim frames are rendered as scene states
arrive, `fps` per second of their sim time, and the first state after an episode reset at once.
A camera that is missing or stops delivering is reported (warning + /diagnostics) and retried
every `retry_period_s`; the node never exits because of it.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Float64MultiArray, String

from vla_runtime.core import topics
from vla_runtime.core.camera_calibration import CameraCalibration
from vla_runtime.drivers.cameras import (
    CalibrationError,
    CameraUnavailable,
    DeviceSource,
    SimSource,
    VideoFileSource,
    load_calibration,
    output_size,
    resize_frame,
)
from vla_runtime.ros.parameters import declare, param
from vla_runtime.ros.qos import LATCHED
from vla_runtime.ros.runtime import run_node

SOURCES = ("sim", "device", "file")
DEFAULT_FPS = 15.0  # files whose fps is unknown
SIM_DEFAULT_SIZE = (224, 224)
OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR"}


@dataclass(frozen=True)
class CameraParams:
    camera_name: str = param("camera name: topics /vla/cameras/<name>/...", "camera")
    source: str = param(f"one of {SOURCES}", "sim")
    device: str = param("device: an OpenCV index or a /dev path", "0")
    path: str = param("file: the video to loop", "")
    fps: float = param("publish rate cap; 0 = the source's own (sim: every scene state)", 0.0)
    width: int = param("output width; 0 = the source's (with height 0)", 0)
    height: int = param("output height; 0 = the source's", 0)
    frame_id: str = param("image frame; empty = <camera_name>_optical_frame", "")
    calibration_file: str = param("camera_calibration_parsers YAML for CameraInfo", "")
    retry_period_s: float = param("s between attempts to reopen a missing camera", 1.0)
    sim_camera: str = param("sim: the MJCF camera; empty = camera_name", "")


class CameraNode(Node):
    def __init__(self, **kwargs) -> None:
        super().__init__(kwargs.pop("node_name", "camera"), **kwargs)
        params = declare(self, CameraParams)
        self.camera_name = params.camera_name
        self.source_kind = params.source
        self.device = params.device
        self.path = params.path
        self.fps = params.fps
        self.width = params.width
        self.height = params.height
        self.frame_id = params.frame_id or f"{self.camera_name}_optical_frame"
        calibration_file = params.calibration_file
        self.retry_period_s = params.retry_period_s
        self.sim_camera = params.sim_camera or self.camera_name

        if self.source_kind not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got '{self.source_kind}'")
        if self.source_kind == "file" and not self.path:
            raise ValueError("source 'file' needs the 'path' parameter")
        if not (math.isfinite(self.fps) and self.fps >= 0):
            raise ValueError(f"fps must be >= 0, got {self.fps}")
        if not (math.isfinite(self.retry_period_s) and self.retry_period_s > 0):
            raise ValueError(f"retry_period_s must be > 0, got {self.retry_period_s}")
        output_size((1, 1), self.width, self.height)  # rejects negative sizes early

        self._lock = threading.Lock()
        self._status = (WARN, "starting")
        self._calibration_problem = ""
        self._calibration = self._load_calibration(calibration_file)
        self._infos: dict[tuple[int, int], CameraInfo] = {}
        self.frames_published = 0
        self._rate_window: list[float] = []

        self._image_pub = self.create_publisher(
            Image, topics.camera_image(self.camera_name), qos_profile_sensor_data
        )
        self._info_pub = self.create_publisher(
            CameraInfo, topics.camera_info(self.camera_name), qos_profile_sensor_data
        )
        self._diag_pub = self.create_publisher(DiagnosticArray, topics.DIAGNOSTICS, 10)
        self.create_timer(1.0, self._publish_diagnostics)

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sim: SimSource | None = None
        if self.source_kind == "sim":
            self._start_sim()
        else:
            self._thread = threading.Thread(
                target=self._capture_loop, name=f"capture-{self.camera_name}", daemon=True
            )
            self._thread.start()

    # ------------------------------------------------------------ status and diagnostics

    @property
    def hardware_id(self) -> str:
        if self.source_kind == "device":
            return f"device:{self.device}"
        if self.source_kind == "file":
            return f"file:{self.path}"
        return f"sim:{self.sim_camera}"

    def _set_status(self, level: bytes, message: str) -> None:
        with self._lock:
            changed = self._status != (level, message)
            self._status = (level, message)
        if not changed:
            return
        text = f"camera '{self.camera_name}' ({self.hardware_id}): {message}"
        if level == OK:
            self.get_logger().info(text)
        else:
            self.get_logger().warning(text)
        self._publish_diagnostics()

    def _publish_diagnostics(self) -> None:
        with self._lock:
            level, message = self._status
            rate = self._measured_rate()
            frames = self.frames_published
        if self._calibration_problem:
            level = max(level, WARN)
            message = f"{message}; {self._calibration_problem}"
        status = DiagnosticStatus(
            level=level,
            name=f"{self.get_name()}: camera {self.camera_name}",
            message=f"camera '{self.camera_name}': {message}",
            hardware_id=self.hardware_id,
            values=[
                KeyValue(key="camera", value=self.camera_name),
                KeyValue(key="source", value=self.source_kind),
                KeyValue(key="frames_published", value=str(frames)),
                KeyValue(key="publish_rate_hz", value=f"{rate:.2f}"),
            ],
        )
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        try:
            self._diag_pub.publish(array)
        except Exception:  # context already shut down: nobody is listening any more
            pass

    def _measured_rate(self) -> float:
        window = self._rate_window
        if len(window) < 2 or window[-1] <= window[0]:
            return 0.0
        return (len(window) - 1) / (window[-1] - window[0])

    # ------------------------------------------------------------ calibration and publishing

    def _load_calibration(self, path: str) -> CameraCalibration | None:
        if not path:
            return None
        try:
            return load_calibration(path)
        except CalibrationError as exc:
            # Keep streaming: frames are still useful, and all-zero K says "uncalibrated".
            self._calibration_problem = f"calibration ignored: {exc}"
            self.get_logger().error(f"camera '{self.camera_name}': {self._calibration_problem}")
            return None

    def _camera_info(self, width: int, height: int) -> CameraInfo:
        info = self._infos.get((width, height))
        if info is not None:
            return info
        if self._calibration is not None:
            calib = self._calibration.scaled_to(width, height)
        elif self._sim is not None:
            calib = CameraCalibration(width, height, K=self._sim.intrinsics())
        else:
            calib = CameraCalibration.uncalibrated(width, height)
        info = CameraInfo(
            width=width,
            height=height,
            distortion_model=calib.distortion_model,
            d=[float(v) for v in calib.D],
            k=[float(v) for v in calib.K.ravel()],
            r=[float(v) for v in calib.R.ravel()],
            p=[float(v) for v in calib.P.ravel()],
        )
        info.header.frame_id = self.frame_id
        self._infos[(width, height)] = info
        return info

    def _publish(self, frame: np.ndarray, stamp: Time) -> None:
        width, height = output_size((frame.shape[1], frame.shape[0]), self.width, self.height)
        frame = np.ascontiguousarray(resize_frame(frame, width, height), dtype=np.uint8)
        stamp_msg = stamp.to_msg()
        image = Image(height=height, width=width, encoding="rgb8", is_bigendian=0, step=width * 3)
        image.header.stamp = stamp_msg
        image.header.frame_id = self.frame_id
        image.data = frame.tobytes()
        info = self._camera_info(width, height)
        info.header.stamp = stamp_msg
        self._image_pub.publish(image)
        self._info_pub.publish(info)
        with self._lock:
            self.frames_published += 1
            self._rate_window.append(time.monotonic())
            del self._rate_window[:-30]

    # ------------------------------------------------------------ device / file capture

    def _make_source(self) -> DeviceSource | VideoFileSource:
        if self.source_kind == "device":
            return DeviceSource(self.device, fps=self.fps or None)
        return VideoFileSource(self.path, loop=True)

    def _capture_loop(self) -> None:
        source = self._make_source()
        is_open = False
        next_due = 0.0
        while not self._stop.is_set():
            try:
                if not is_open:
                    source.open()
                    is_open = True
                    next_due = time.monotonic()
                    self._set_status(OK, "streaming")
                rate = self.fps or source.fps
                if not rate and self.source_kind == "file":
                    rate = DEFAULT_FPS  # never read a file as fast as the disk allows
                period = 1.0 / rate if rate else 0.0
                if self.source_kind == "file" and period:
                    # A file has no clock of its own: wait until the next frame is due.
                    if self._stop.wait(max(0.0, next_due - time.monotonic())):
                        break
                ok, frame = source.read()
                if not ok:
                    raise CameraUnavailable("stopped delivering frames")
                stamp = self.get_clock().now()
                now = time.monotonic()
                if self.source_kind == "device" and period and now < next_due - 0.25 * period:
                    continue  # the device runs faster than `fps`: drop this frame
                # Next slot one period on; after a stall restart the schedule instead of bursting.
                next_due = max(next_due + period, now - period)
                self._publish(frame, stamp)
            except Exception as exc:
                if self._stop.is_set() or not self.context.ok():
                    break
                source.close()
                level = ERROR if not is_open else WARN
                is_open = False
                self._set_status(level, f"{exc}; retrying every {self.retry_period_s:g} s")
                self._stop.wait(self.retry_period_s)
        source.close()

    # ------------------------------------------------------------ sim

    def _start_sim(self) -> None:
        self.create_subscription(String, topics.SIM_SCENE_XML, self._on_scene_xml, LATCHED)
        self.create_subscription(
            Float64MultiArray, topics.SIM_SCENE_STATE, self._on_scene_state, qos_profile_sensor_data
        )
        self.create_subscription(String, topics.EPISODE, self._on_episode, LATCHED)
        self._set_status(WARN, f"waiting for the scene on {topics.SIM_SCENE_XML}")

    def _on_scene_xml(self, msg: String) -> None:
        width, height = output_size(SIM_DEFAULT_SIZE, self.width, self.height)
        source = SimSource(msg.data, self.sim_camera, width, height, self.fps)
        try:
            source.open()
        except CameraUnavailable as exc:
            self._set_status(ERROR, f"{exc}; waiting for a new scene")
            return
        previous, self._sim = self._sim, source
        if previous is not None:
            previous.close()
        self._infos.clear()
        self._set_status(WARN, f"scene loaded, waiting for {topics.SIM_SCENE_STATE}")

    def _on_scene_state(self, msg: Float64MultiArray) -> None:
        values = np.asarray(msg.data, dtype=float)
        if values.size < 2 or not np.all(np.isfinite(values)):
            self.get_logger().warning(
                f"camera '{self.camera_name}': ignoring scene state that is not "
                "[sim_time, *qpos] with finite values",
                throttle_duration_sec=5.0,
            )
            return
        if self._sim is not None:
            self._sim.update(values[0], values[1:])
            self._render_sim()

    def _on_episode(self, _msg: String) -> None:
        if self._sim is not None:
            self._sim.render_next()  # the scene was reset: the engine waits for a frame of it

    def _render_sim(self) -> None:
        if self._sim is None:
            return
        try:
            ok, frame = self._sim.read()
        except Exception as exc:  # e.g. a state whose qpos does not match the scene
            self._set_status(ERROR, f"render failed: {exc}")
            return
        if not ok:
            return
        self._publish(frame, Time(nanoseconds=round(self._sim.frame_time * 1e9)))
        self._set_status(OK, "streaming")

    # ------------------------------------------------------------ shutdown

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._sim is not None:
            self._sim.close()


def main(argv: list[str] | None = None) -> int:
    return run_node(CameraNode, argv)


if __name__ == "__main__":
    sys.exit(main())
