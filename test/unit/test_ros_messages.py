"""Message codecs: images, camera info and diagnostics built the way the nodes read them."""

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticStatus

from vla_runtime.core.camera_calibration import CameraCalibration
from vla_runtime.ros.messages import camera_info_msg, diagnostics_msg, image_from_msg, image_msg


def test_an_image_message_reads_back_as_the_frame():
    wide = np.arange(2 * 6 * 3, dtype=np.uint8).reshape(2, 6, 3)
    frame = wide[:, ::2]  # not contiguous: every other column
    msg = image_msg(frame, Time(sec=4, nanosec=5), "cam_optical_frame")
    assert (msg.encoding, msg.width, msg.height, msg.step) == ("rgb8", 3, 2, 9)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (4, 5)
    assert msg.header.frame_id == "cam_optical_frame"
    np.testing.assert_array_equal(image_from_msg(msg), frame)


def test_camera_info_carries_the_calibration_row_major():
    K = [[100.0, 0.0, 16.0], [0.0, 90.0, 12.0], [0.0, 0.0, 1.0]]
    calib = CameraCalibration(32, 24, K=K, D=[0.1, -0.2, 0.0, 0.0, 0.0])
    info = camera_info_msg(calib, "front_optical_frame")
    assert (info.width, info.height, info.distortion_model) == (32, 24, "plumb_bob")
    assert info.header.frame_id == "front_optical_frame"
    assert list(info.k) == [100.0, 0.0, 16.0, 0.0, 90.0, 12.0, 0.0, 0.0, 1.0]
    assert list(info.p) == [100.0, 0.0, 16.0, 0.0, 0.0, 90.0, 12.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert list(info.r) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert list(info.d) == [0.1, -0.2, 0.0, 0.0, 0.0]


def test_diagnostic_array_of_one_status():
    array = diagnostics_msg(
        "camera front", DiagnosticStatus.WARN, "stalled", {"frames": 3}, Time(sec=7), "dev:0"
    )
    assert array.header.stamp.sec == 7
    (status,) = array.status
    assert (status.level, status.name, status.message) == (
        DiagnosticStatus.WARN,
        "camera front",
        "stalled",
    )
    assert status.hardware_id == "dev:0"
    assert [(kv.key, kv.value) for kv in status.values] == [("frames", "3")]
