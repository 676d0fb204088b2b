"""The camera node as its own process over real DDS, fed from a video file."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import qos_profile_sensor_data

from vla_runtime.core import topics

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
    args = [sys.executable, "-m", "vla_runtime.nodes.camera", "--ros-args"]
    args += ["-p", f"camera_name:={name}", "-p", "source:=file"]
    for key, value in params.items():
        args += ["-p", f"{key}:={value}"]
    log = open(tmp_path / f"camera_{name}.log", "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())


def stop(proc, tmp_path, name):
    """SIGTERM must end the node cleanly (exit 0); kill only as a last resort."""
    proc.terminate()
    try:
        code = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    return code, (tmp_path / f"camera_{name}.log").read_text()


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
        code, log = stop(proc, tmp_path, "front")
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
    stamps = [img.header.stamp.sec + img.header.stamp.nanosec * 1e-9 for img in images]
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

    proc = start_camera(tmp_path, "late", path=video, retry_period_s=0.2, fps=10.0)
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
        code, log = stop(proc, tmp_path, "late")
        executor.shutdown()
        node.destroy_node()
    assert code == 0, log
    assert "does not exist" in log  # the warning log names the problem too
