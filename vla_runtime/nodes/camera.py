"""Camera node: publishes one camera's frames as sensor_msgs/Image (rgb8) + CameraInfo.

Sources (parameter `source`):
- "device": an OpenCV/V4L2 camera (`device` = index or /dev path), read in a capture thread.
- "file": a video file (`path`) that loops, paced to its own fps, read in a capture thread.
- "sim": renders an MJCF camera of the simulated scene from /sim/scene_xml + /sim/scene_state,
  stamped with the sim time of the state it shows.

`fps` caps the publish rate; 0 (the default) means the source's own rate: the file's fps
(15 Hz for a file that does not state it), whatever the device delivers, and for sim a frame
of every scene state (in lock-step: one per step batch). Sim frames are rendered as scene states
arrive, `fps` per second of their sim time, and the first state after an episode reset at once;
the state the last frame shows, arriving again (a lock-step driver publishing its streams again
because something on the way was lost), sends that frame again.
A camera that is missing or stops delivering is reported (warning + /diagnostics) and retried
every `retry_period_s`; the node never exits because of it.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import TransformStamped
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Float64MultiArray, String

from vla_runtime.core import topics
from vla_runtime.core.calibration_files import load_static_transform
from vla_runtime.core.camera_calibration import CameraCalibration, published_calibration
from vla_runtime.core.injected_delay import InjectedDelay
from vla_runtime.drivers.camera_capture import ERROR, OK, WARN, CameraHealth, CaptureThread
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
from vla_runtime.ros.messages import (
    camera_info_msg,
    diagnostics_msg,
    image_msg,
    to_time,
    transform_stamped_msg,
)
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.parameters import declare, param
from vla_runtime.ros.qos import LATCHED
from vla_runtime.ros.runtime import run_node

try:  # a ROS install has it; dev.sh builds it from interfaces/tf2_msgs (no pip wheel)
    from tf2_msgs.msg import TFMessage
except ImportError:
    TFMessage = None

SOURCES = ("sim", "device", "file")
SIM_DEFAULT_SIZE = (224, 224)


def _present(folder: str, name: str) -> str:
    """folder/name when that file exists, else ""."""
    path = Path(folder) / name
    return str(path) if folder and path.is_file() else ""


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
    calibration_dir: str = param("folder of `vla-runtime calibrate` results: <camera_name>.yaml "
                                 "and <camera_name>_extrinsics.yaml there are used when present "
                                 "and the *_file parameters are empty", "")  # fmt: skip
    retry_period_s: float = param("s between attempts to reopen a missing camera", 1.0)
    sim_camera: str = param("sim: the MJCF camera; empty = camera_name", "")
    injected_delay: str = param(
        "extra delay of each frame (latency tests): seconds or lognormal:MEDIAN:P:MIN:MAX", ""
    )
    extrinsics_file: str = param("static transform YAML (calibration/<camera>_extrinsics.yaml) "
                                 "to publish; empty = none", "")  # fmt: skip


class CameraNode(RuntimeNode):
    def __init__(self, **kwargs) -> None:
        super().__init__(kwargs.pop("node_name", "camera"), **kwargs)
        params = declare(self, CameraParams)
        self.params = p = replace(
            params,
            frame_id=params.frame_id or f"{params.camera_name}_optical_frame",
            sim_camera=params.sim_camera or params.camera_name,
            calibration_file=params.calibration_file
            or _present(params.calibration_dir, f"{params.camera_name}.yaml"),
            extrinsics_file=params.extrinsics_file
            or _present(params.calibration_dir, f"{params.camera_name}_extrinsics.yaml"),
        )
        if p.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got '{p.source}'")
        if p.source == "file" and not p.path:
            raise ValueError("source 'file' needs the 'path' parameter")
        if not (math.isfinite(p.fps) and p.fps >= 0):
            raise ValueError(f"fps must be >= 0, got {p.fps}")
        if not (math.isfinite(p.retry_period_s) and p.retry_period_s > 0):
            raise ValueError(f"retry_period_s must be > 0, got {p.retry_period_s}")
        output_size((1, 1), p.width, p.height)  # rejects negative sizes early
        self.hardware_id = {"device": f"device:{p.device}", "file": f"file:{p.path}"}.get(
            p.source, f"sim:{p.sim_camera}"
        )

        self._health = CameraHealth()
        self._calibration = self._load_calibration(p.calibration_file)
        self._delay = InjectedDelay.parse(p.injected_delay)
        self._delay_rng = np.random.default_rng()
        self._delayed: queue.Queue | None = None
        if self._delay.active:
            self._delayed = queue.Queue()
            threading.Thread(target=self._send_delayed, name="camera-delay", daemon=True).start()
        self._infos: dict[tuple[int, int], CameraInfo] = {}

        self._image_pub = self.create_publisher(
            Image, topics.camera_image(p.camera_name), qos_profile_sensor_data
        )
        self._info_pub = self.create_publisher(
            CameraInfo, topics.camera_info(p.camera_name), qos_profile_sensor_data
        )
        self._diag_pub = self.create_publisher(DiagnosticArray, topics.DIAGNOSTICS, 10)
        self.create_timer(1.0, self._publish_diagnostics)
        self._extrinsics_pubs = self._publish_extrinsics(p.extrinsics_file)

        self._thread: CaptureThread | None = None
        self._sim: SimSource | None = None
        self._last_sent: tuple[Image, CameraInfo] | None = None  # the newest frame published
        if p.source == "sim":
            self._start_sim()
        else:
            if p.source == "device":
                source = DeviceSource(p.device, fps=p.fps or None)
            else:
                source = VideoFileSource(p.path, loop=True)
            self._thread = CaptureThread(
                source, p.fps, p.retry_period_s,
                on_frame=lambda frame: self._publish(frame, self.get_clock().now().to_msg()),
                on_status=self._set_status, alive=self.context.ok, name=f"capture-{p.camera_name}",
            )  # fmt: skip
            self._thread.start()

    # ------------------------------------------------------------ status and diagnostics

    def _set_status(self, level: bytes, message: str) -> None:
        if not self._health.set_status(level, message):
            return
        text = f"camera '{self.params.camera_name}' ({self.hardware_id}): {message}"
        if level == OK:
            self.get_logger().info(text)
        else:
            self.get_logger().warning(text)
        self._publish_diagnostics()

    def _publish_diagnostics(self) -> None:
        level, message, health = self._health.report()
        name = self.params.camera_name
        array = diagnostics_msg(
            f"{self.get_name()}: camera {name}",
            level,
            f"camera '{name}': {message}",
            {"camera": name, "source": self.params.source, **health},
            self.get_clock().now().to_msg(),
            self.hardware_id,
        )
        try:
            self._diag_pub.publish(array)
        except Exception:  # context already shut down: nobody is listening any more
            pass

    # ------------------------------------------------------------ calibration and publishing

    def _load_calibration(self, path: str) -> CameraCalibration | None:
        if not path:
            return None
        try:
            return load_calibration(path)
        except CalibrationError as exc:
            # Keep streaming: frames are still useful, and all-zero K says "uncalibrated".
            self._health.calibration_problem = problem = f"calibration ignored: {exc}"
            self.get_logger().error(f"camera '{self.params.camera_name}': {problem}")
            return None

    def _camera_info(self, width: int, height: int) -> CameraInfo:
        info = self._infos.get((width, height))
        if info is None:
            sim = self._sim if self._calibration is None else None  # a file's calibration wins
            K = sim.intrinsics() if sim is not None else None
            calibration = published_calibration(width, height, self._calibration, K)
            info = self._infos[(width, height)] = camera_info_msg(calibration, self.params.frame_id)
        return info

    def _publish(self, frame: np.ndarray, stamp: TimeMsg) -> None:
        p = self.params
        width, height = output_size((frame.shape[1], frame.shape[0]), p.width, p.height)
        image = image_msg(resize_frame(frame, width, height), stamp, p.frame_id)
        info = self._camera_info(width, height)
        info.header.stamp = stamp
        self._last_sent = (image, info)
        if self._delayed is not None:
            self._delayed.put((time.monotonic() + self._delay.sample(self._delay_rng), image, info))
            return
        self._image_pub.publish(image)
        self._info_pub.publish(info)
        self._health.frame_published(time.monotonic())

    def _send_delayed(self) -> None:
        """Frames held back by `injected_delay`, sent in order when due (a slow link)."""
        while self.context.ok():
            try:
                due, image, info = self._delayed.get(timeout=0.5)
            except queue.Empty:
                continue
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                self._image_pub.publish(image)
                self._info_pub.publish(info)
            except Exception:  # shutting down
                return
            self._health.frame_published(time.monotonic())

    def _publish_extrinsics(self, path: str) -> list:
        """The camera's calibrated pose as a latched transform on /tf_static; without tf2_msgs,
        as geometry_msgs/TransformStamped on /vla/tf_static (ROS tools do not read that topic)."""
        if not path:
            return []
        try:
            extrinsics = load_static_transform(path)
        except (OSError, ValueError) as exc:
            name = self.params.camera_name
            self.get_logger().error(f"camera '{name}': extrinsics ignored: {exc}")
            return []
        msg = transform_stamped_msg(extrinsics, self.get_clock().now().to_msg())
        if TFMessage is not None:
            pub = self.create_publisher(TFMessage, topics.TF_STATIC, LATCHED)
            pub.publish(TFMessage(transforms=[msg]))
        else:
            pub = self.create_publisher(TransformStamped, topics.STATIC_TRANSFORMS, LATCHED)
            pub.publish(msg)
        return [pub]

    # ------------------------------------------------------------ sim

    def _start_sim(self) -> None:
        self.create_subscription(String, topics.SIM_SCENE_XML, self._on_scene_xml, LATCHED)
        self.create_subscription(
            Float64MultiArray, topics.SIM_SCENE_STATE, self._on_scene_state, qos_profile_sensor_data
        )
        self.create_subscription(String, topics.EPISODE, self._on_episode, LATCHED)
        self._set_status(WARN, f"waiting for the scene on {topics.SIM_SCENE_XML}")

    def _on_scene_xml(self, msg: String) -> None:
        p = self.params
        width, height = output_size(SIM_DEFAULT_SIZE, p.width, p.height)
        source = SimSource(msg.data, p.sim_camera, width, height, p.fps)
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
                f"camera '{self.params.camera_name}': ignoring scene state that is not "
                "[sim_time, *qpos] with finite values",
                throttle_duration_sec=5.0,
            )
            return
        if self._sim is None:
            return
        if self._last_sent is not None and self._sim.shows(values[0], values[1:]):
            image, info = self._last_sent  # best effort: a frame may not have arrived
            self._image_pub.publish(image)
            self._info_pub.publish(info)
            return
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
        self._publish(frame, to_time(self._sim.frame_time))
        self._set_status(OK, "streaming")

    # ------------------------------------------------------------ shutdown

    def close(self) -> None:
        if self._thread is not None:
            self._thread.stop()
        if self._sim is not None:
            self._sim.close()


def main(argv: list[str] | None = None) -> int:
    return run_node(CameraNode, argv)


if __name__ == "__main__":
    sys.exit(main())
