"""Calibration results in the running stack: the camera node publishes a calibration folder's
camera_info and extrinsics (on /tf_static, as tf2 reads them); the latency procedure recovers an
injected camera delay."""

from __future__ import annotations

import numpy as np
import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo
from test_camera_node import spin_until, start_camera, stop, write_video
from tf2_msgs.msg import TFMessage

from vla_runtime.core import topics
from vla_runtime.core.calibration_files import StaticTransform, camera_info_yaml
from vla_runtime.core.camera_calibration import CameraCalibration
from vla_runtime.data.calibrate import sim_latency
from vla_runtime.ros.qos import STATIC_TRANSFORM_LISTENER

pytestmark = pytest.mark.integration

INJECTED_DELAY_S = 0.06
DELAY_TOLERANCE_S = 0.01
# ROS 2 Jazzy's tf2_msgs/msg/TFMessage: a subscriber of another build matches only this hash.
TF_MESSAGE_TYPE_HASH = "RIHS01_e369d0f05a23ae52508854b66f6aa0437f3449d652e8cbf22d5abe85d020f087"


def test_camera_node_publishes_the_calibration_folder(rclpy_context, tmp_path):
    import rclpy

    video = tmp_path / "clip.avi"
    write_video(video)
    folder = tmp_path / "calibration"
    folder.mkdir()
    K = np.array([[80.0, 0, 31.5], [0, 80.0, 23.5], [0, 0, 1]])
    (folder / "front.yaml").write_text(camera_info_yaml(CameraCalibration(64, 48, K=K)))
    extrinsics = StaticTransform("fr3_link0", "front_optical_frame", (1.0, 0.5, 0.9), (0, 0, 0, 1))
    (folder / "front_extrinsics.yaml").write_text(extrinsics.to_yaml())

    node = rclpy.create_node("probe", context=rclpy_context)
    infos, transforms = [], []
    node.create_subscription(
        CameraInfo, topics.camera_info("front"), infos.append, qos_profile_sensor_data
    )
    node.create_subscription(
        TFMessage, topics.TF_STATIC, transforms.append, STATIC_TRANSFORM_LISTENER
    )
    executor = SingleThreadedExecutor(context=rclpy_context)
    executor.add_node(node)
    proc = start_camera(tmp_path, "front", path=video, calibration_dir=folder)
    try:
        assert spin_until(executor, lambda: infos and transforms, timeout=60)
        (camera_endpoint,) = node.get_publishers_info_by_topic(topics.TF_STATIC)
    finally:
        code, log = stop(proc)
        executor.shutdown()
        node.destroy_node()
    assert code == 0, log
    np.testing.assert_allclose(np.reshape(infos[0].k, (3, 3)), K)
    assert camera_endpoint.topic_type == "tf2_msgs/msg/TFMessage"
    assert str(camera_endpoint.topic_type_hash) == TF_MESSAGE_TYPE_HASH
    (sent,) = transforms[0].transforms
    assert (sent.header.frame_id, sent.child_frame_id) == ("fr3_link0", "front_optical_frame")
    assert sent.transform.translation.x == 1.0 and sent.transform.rotation.w == 1.0


def test_latency_recovers_an_injected_camera_delay():
    """Both cameras render 64 px images; only the scene camera's frames are held
    back, so the difference of their latencies is the injected delay."""
    measured = sim_latency(
        {"scene": str(INJECTED_DELAY_S), "wrist": ""}, steps=2, image_size=64, frames=30
    )
    # The injected delay is a constant shift: the fast frames of each camera show it without the
    # load-dependent render and transport times that spread the medians on a busy host; the 10th
    # percentile, not the minimum, so that one late joint state (which shortens one frame's
    # apparent latency) does not move it.
    difference = measured.cameras["scene"]["p10_s"] - measured.cameras["wrist"]["p10_s"]
    assert abs(difference - INJECTED_DELAY_S) < DELAY_TOLERANCE_S, measured.cameras
    assert 0.0 < measured.command_to_motion["median_s"] < 0.1, measured.command_to_motion
    assert measured.command_to_image_motion["wrist"]["median_s"] > 0.0
