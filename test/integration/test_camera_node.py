"""The camera node as its own process over real DDS, fed from a video file."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import qos_profile_sensor_data

from vla_runtime.core import topics
from vla_runtime.ros.messages import to_seconds
from vla_runtime.stack.supervisor import module_process

pytestmark = pytest.mark.integration

WIDTH, HEIGHT, FPS, FRAMES = 64, 48, 20.0, 10


def write_video(path, frames=FRAMES):
    """Frame k is uniform grey 20 * k + 10, so a received image tells which frame it is."""
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    for k in range(frames):
        writer.write(np.full((HEIGHT, WIDTH, 3), 20 * k + 10, np.uint8))
    writer.release()


def start_camera(tmp_path, name, **params):
    settings = {"camera_name": name, "source": "file", **params}
    return module_process(
        "vla_runtime.nodes.camera",
        *(f"{key}:={value}" for key, value in settings.items()),
        log_path=tmp_path / f"camera_{name}.log",
    ).start()


def stop(proc):
    """SIGTERM must end the node cleanly (exit 0); kill only as a last resort."""
    return proc.stop(signal.SIGTERM, 15), proc.output()


def spin_until(executor, condition, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        executor.spin_once(timeout_sec=0.05)
    return condition()


def frame_index(image) -> int:
    return round((float(np.frombuffer(bytes(image.data), np.uint8).mean()) - 10) / 20)


def test_file_camera_publishes_loops_and_scales_calibration(rclpy_context, tmp_path):
    import rclpy
    from sensor_msgs.msg import CameraInfo, Image

    video = tmp_path / "clip.avi"
    write_video(video)
    calib = tmp_path / "calib.yaml"
    calib.write_text(
        "image_width: 64\nimage_height: 48\n"
        "camera_matrix: {rows: 3, cols: 3, data: [80, 0, 32, 0, 60, 24, 0, 0, 1]}\n"
        "distortion_coefficients: {rows: 1, cols: 5, data: [0.1, 0, 0, 0, 0]}\n"
    )
    node = rclpy.create_node("probe", context=rclpy_context)
    images, infos = [], []
    node.create_subscription(
        Image, topics.camera_image("front"), images.append, qos_profile_sensor_data
    )
    node.create_subscription(
        CameraInfo, topics.camera_info("front"), infos.append, qos_profile_sensor_data
    )
    executor = SingleThreadedExecutor(context=rclpy_context)
    executor.add_node(node)
    proc = start_camera(
        tmp_path, "front", path=video, width=32, calibration_file=calib, frame_id="front_cam"
    )
    try:
        # 30 frames is three passes over the 10-frame file.
        assert spin_until(executor, lambda: len(images) >= 30, timeout=60), (
            f"got {len(images)} images"
        )
        assert proc.poll() is None
    finally:
        code, log = stop(proc)
        executor.shutdown()
        node.destroy_node()
    assert code == 0, log

    first = images[0]
    assert (first.encoding, first.width, first.height, first.step) == ("rgb8", 32, 24, 96)
    assert len(first.data) == 32 * 24 * 3
    assert first.header.frame_id == "front_cam"

    # Looping: the frame index wraps from the file's end back to its start, repeatedly.
    indices = [frame_index(image) for image in images]
    wraps = sum(1 for a, b in zip(indices, indices[1:], strict=False) if b < a)
    assert wraps >= 2, indices
    assert set(indices) <= set(range(FRAMES))

    # Paced to the file's 20 fps (capture stamps), not read as fast as the disk allows.
    stamps = [to_seconds(img.header.stamp) for img in images]
    assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False))
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    assert 5.0 < rate < FPS * 1.25, rate
    # Stamps are ROS time (wall clock here): close to now, not zero or monotonic-since-boot.
    assert abs(stamps[-1] - time.time()) < 60

    info = infos[-1]
    assert (info.width, info.height) == (32, 24)
    np.testing.assert_allclose(np.reshape(info.k, (3, 3)), [[40, 0, 16], [0, 30, 12], [0, 0, 1]])
    assert list(info.d) == [0.1, 0.0, 0.0, 0.0, 0.0]
    assert info.header.frame_id == "front_cam"


def test_missing_file_is_reported_and_frames_start_when_it_appears(rclpy_context, tmp_path):
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
    from sensor_msgs.msg import Image

    video = tmp_path / "late.avi"
    node = rclpy.create_node("probe", context=rclpy_context)
    images, statuses = [], []
    node.create_subscription(
        Image, topics.camera_image("late"), images.append, qos_profile_sensor_data
    )
    node.create_subscription(
        DiagnosticArray, topics.DIAGNOSTICS, lambda msg: statuses.extend(msg.status), 50
    )
    executor = SingleThreadedExecutor(context=rclpy_context)
    executor.add_node(node)

    def about_late(level):
        return [
            s
            for s in statuses
            if s.level == level and "late" in s.message and s.hardware_id.endswith("late.avi")
        ]

    proc = start_camera(
        tmp_path, "late", path=video, retry_period_s=0.2, fps=10
    )  # int fps: as YAML gives it
    try:
        assert spin_until(executor, lambda: about_late(DiagnosticStatus.ERROR), timeout=60)
        assert "does not exist" in about_late(DiagnosticStatus.ERROR)[-1].message
        # Several retry periods later the node is still alive and has published nothing.
        spin_until(executor, lambda: False, timeout=1.0)
        assert proc.poll() is None
        assert images == []

        staging = tmp_path / "staging.avi"
        write_video(staging)
        os.replace(staging, video)  # appears whole, never half-written
        assert spin_until(executor, lambda: len(images) >= 5, timeout=60)
        assert spin_until(executor, lambda: about_late(DiagnosticStatus.OK), timeout=30)
        assert images[0].width == WIDTH and images[0].height == HEIGHT
        assert proc.poll() is None
    finally:
        code, log = stop(proc)
        executor.shutdown()
        node.destroy_node()
    assert code == 0, log
    assert "does not exist" in log  # the warning log names the problem too


SCENE_XML = """
<mujoco>
  <worldbody>
    <light pos="0 0 3"/>
    <geom type="plane" size="2 2 0.1" rgba="0.8 0.8 0.8 1"/>
    <body name="box" pos="0 0 0">
      <freejoint/>
      <geom type="box" size="0.1 0.1 0.1" rgba="1 0 0 1"/>
    </body>
    <camera name="top" pos="0 0 1.5" fovy="60"/>
  </worldbody>
</mujoco>
"""


def test_sim_camera_renders_scene_state_with_its_sim_stamp(rclpy_context, tmp_path):
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import CameraInfo, Image
    from std_msgs.msg import Float64MultiArray, String

    node = rclpy.create_node("probe", context=rclpy_context)
    images, infos, statuses = [], [], []
    node.create_subscription(
        Image, topics.camera_image("top"), images.append, qos_profile_sensor_data
    )
    node.create_subscription(
        CameraInfo, topics.camera_info("top"), infos.append, qos_profile_sensor_data
    )
    node.create_subscription(
        DiagnosticArray, topics.DIAGNOSTICS, lambda msg: statuses.extend(msg.status), 50
    )
    latched = QoSProfile(
        depth=1,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )
    node.create_publisher(String, topics.SIM_SCENE_XML, latched).publish(String(data=SCENE_XML))
    state_pub = node.create_publisher(
        Float64MultiArray, topics.SIM_SCENE_STATE, qos_profile_sensor_data
    )
    executor = SingleThreadedExecutor(context=rclpy_context)
    executor.add_node(node)

    def stamped(sim_time):
        for image in images:
            if to_seconds(image.header.stamp) == sim_time:
                return image
        return None

    def show(state, sim_time, timeout=60):
        """Publish the state until the camera has published a frame of it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and stamped(sim_time) is None:
            state_pub.publish(Float64MultiArray(data=[sim_time, *state]))
            spin_until(executor, lambda: stamped(sim_time) is not None, timeout=0.2)
        return stamped(sim_time)

    def centre_rgb(image):
        pixels = np.frombuffer(bytes(image.data), np.uint8).reshape(image.height, image.width, 3)
        return pixels[image.height // 2, image.width // 2].astype(int)

    proc = module_process(
        "vla_runtime.nodes.camera",
        *("camera_name:=top", "source:=sim", "width:=64", "height:=48"),
        log_path=tmp_path / "camera_top.log",
        env=dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl")),
    ).start()
    try:
        centred = show([0, 0, 0.1, 1, 0, 0, 0], 1.5)
        assert centred is not None, "no frame of the first state"
        red, green, blue = centre_rgb(centred)
        assert red > 100 and red > 2 * green and red > 2 * blue  # the red box below the camera

        moved = show([0.8, 0, 0.1, 1, 0, 0, 0], 2.25)
        assert moved is not None, "no frame of the moved state"
        red, green, blue = centre_rgb(moved)
        assert red < 2 * green  # the floor, not the box

        # The state the last frame shows, again (a lock-step driver publishing it again): that
        # frame is sent again, so a frame lost on its best-effort way can be asked for.
        def sent(sim_time):
            return sum(to_seconds(image.header.stamp) == sim_time for image in images)

        before, deadline = sent(2.25), time.monotonic() + 60
        while time.monotonic() < deadline and sent(2.25) == before:
            state_pub.publish(Float64MultiArray(data=[2.25, 0.8, 0, 0.1, 1, 0, 0, 0]))
            spin_until(executor, lambda: sent(2.25) > before, timeout=0.2)
        again = [image for image in images if to_seconds(image.header.stamp) == 2.25]
        assert len(again) > before and bytes(again[-1].data) == bytes(moved.data)

        # A state that does not fit the scene is reported; the node lives on.
        spin_until(executor, lambda: False, timeout=0.2)
        for _ in range(20):
            state_pub.publish(Float64MultiArray(data=[3.0, 1.0, 2.0]))
            if spin_until(
                executor,
                lambda: any(
                    s.level == DiagnosticStatus.ERROR and "render failed" in s.message
                    for s in statuses
                ),
                timeout=0.5,
            ):
                break
        assert any(s.level == DiagnosticStatus.ERROR and "top" in s.message for s in statuses)
        assert stamped(3.0) is None
        assert proc.poll() is None
        assert show([0, 0, 0.1, 1, 0, 0, 0], 4.0) is not None  # and recovers
    finally:
        code, log = stop(proc)
        executor.shutdown()
        node.destroy_node()
    assert code == 0, log

    assert (centred.encoding, centred.width, centred.height) == ("rgb8", 64, 48)
    info = infos[-1]
    focal = 0.5 * 48 / np.tan(np.radians(30.0))  # MuJoCo's fovy is vertical
    np.testing.assert_allclose(
        np.reshape(info.k, (3, 3)),
        [[focal, 0, 31.5], [0, focal, 23.5], [0, 0, 1]],  # pixel centres
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"source": "webcam"}, "source must be one of"),
        ({"source": "file"}, "needs the 'path'"),
        ({"source": "sim", "width": -4}, "width/height"),
        ({"source": "sim", "fps": "fast"}, "parameter fps must be float"),
        ({"source": "sim", "retry_period_s": 0.0}, "retry_period_s"),
    ],
)
def test_bad_parameters_are_clear_errors(rclpy_context, overrides, message):
    from rclpy.parameter import Parameter

    from vla_runtime.nodes.camera import CameraNode

    params = [Parameter(key, value=value) for key, value in overrides.items()]
    with pytest.raises(ValueError, match=message):
        CameraNode(context=rclpy_context, parameter_overrides=params)


def test_missing_device_is_retried_in_process(rclpy_context):
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.parameter import Parameter

    from vla_runtime.nodes.camera import CameraNode

    params = {"source": "device", "device": "/dev/video_vla_absent", "retry_period_s": 0.1}
    node = CameraNode(
        context=rclpy_context,
        parameter_overrides=[Parameter(k, value=v) for k, v in params.items()],
    )
    try:
        deadline = time.monotonic() + 30
        while node._health.status[0] != DiagnosticStatus.ERROR and time.monotonic() < deadline:
            time.sleep(0.05)
        level, message = node._health.status
        assert level == DiagnosticStatus.ERROR
        assert "/dev/video_vla_absent does not exist" in message
        time.sleep(0.3)  # a few retries later the capture thread is still trying
        assert node._thread.is_alive()
    finally:
        node.close()
        node.destroy_node()
    assert not node._thread.is_alive()
