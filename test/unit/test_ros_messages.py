"""The ROS boundary's codecs: images, camera info, diagnostics, joint states, commands,
requests, checked chunks and safety events, built the way the nodes read them."""

import json

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticStatus
from sensor_msgs.msg import JointState

from vla_runtime.core.camera_calibration import CameraCalibration
from vla_runtime.core.safety.chunk_check import CLIP, Verdict
from vla_runtime.core.safety.chunk_pipeline import PendingChunk, chunk_report
from vla_runtime.core.streaming.streamer import Request, Setpoint
from vla_runtime.ros.messages import (
    REQUEST_PREFIX,
    arm_command_msg,
    camera_info_msg,
    checked_chunk_msg,
    chunk_msg,
    command_msg,
    command_values,
    diagnostics_msg,
    event_json,
    image_from_msg,
    image_msg,
    joint_state_msg,
    joint_state_values,
    parse_request_id,
    refused_request,
    request_msg,
    split_request_frame,
    to_seconds,
)


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


def test_safety_verdicts_name_the_refused_request():
    def event(verdict, request=f"{REQUEST_PREFIX}7", kind="chunk"):
        return json.dumps({"source": "chunk_check", "event": kind, "verdict": verdict,
                           "request": request})  # fmt: skip

    assert refused_request(event("veto")) == 7
    assert refused_request(event("stale")) == 7
    assert refused_request(event("clip")) is None and refused_request(event("accept")) is None
    assert refused_request(event("veto", request="")) is None  # not the streamer's request
    assert refused_request(event("veto", kind="estop")) is None
    assert refused_request("not json") is None and refused_request("[1]") is None


def test_request_ids_round_trip_through_the_frame_id():
    request = Request(12, 3.5, np.array([0.25, 0.5]), np.array([[1.0, 2.0], [3.0, 4.0]]))
    msg = request_msg(["a", "b"], request)
    assert msg.header.frame_id == "req:12" and parse_request_id(msg.header.frame_id) == 12
    assert to_seconds(msg.header.stamp) == 3.5
    assert [to_seconds(p.time_from_start) for p in msg.points] == [0.25, 0.5]
    assert [list(p.positions) for p in msg.points] == [[1.0, 2.0], [3.0, 4.0]]
    assert parse_request_id("req:x") is None and parse_request_id("12") is None
    assert split_request_frame(msg.header.frame_id) == ("req:12", 0)
    retry = request_msg(["a", "b"], Request(13, 3.5, np.empty(0), np.empty((0, 2)), retry=2))
    assert retry.header.frame_id == "req:13 retry:2"
    assert split_request_frame(retry.header.frame_id) == ("req:13", 2)
    assert split_request_frame("req:13 retry:-1") == ("req:13", 0)
    assert parse_request_id(retry.header.frame_id) == 13  # an engine that echoes it whole


def test_joint_state_values_in_the_asked_order():
    msg = JointState(name=["b", "a", "c"], position=[2.0, 1.0, 3.0], velocity=[0.2, 0.1, 0.3])
    assert joint_state_values(msg, ["a", "b"]) == ([1.0, 2.0], [0.1, 0.2])
    msg.velocity = [0.2]  # not one per name: no velocities
    assert joint_state_values(msg, ["a", "b"]) == ([1.0, 2.0], None)
    assert joint_state_values(msg, ["a", "d"]) is None
    short = JointState(name=["a", "b"], position=[1.0])
    assert joint_state_values(short, ["b"]) is None
    assert joint_state_values(short, ["a"]) == ([1.0], None)


def test_a_joint_state_message_carries_the_names_stamp_and_floats():
    msg = joint_state_msg(("a", "b"), Time(sec=3, nanosec=5), np.array([1.0, 2.0]), [0, 0.5])
    assert list(msg.name) == ["a", "b"] and (msg.header.stamp.sec, msg.header.stamp.nanosec) == (
        3, 5)  # fmt: skip
    assert list(msg.position) == [1.0, 2.0] and list(msg.velocity) == [0.0, 0.5]
    assert joint_state_values(msg, ["b"]) == ([2.0], [0.5])


def test_command_is_stamped_with_the_command_time():
    setpoint = Setpoint(2.000000001, np.array([1.0, 2.0]), np.array([0.5, 0.0]), None, False)
    msg = command_msg(["a", "b"], setpoint)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (2, 1)
    assert list(msg.name) == ["a", "b"]
    assert list(msg.position) == [1.0, 2.0] and list(msg.velocity) == [0.5, 0.0]


def test_command_values_read_the_arm_in_order_and_the_gripper_as_a_width():
    msg = JointState(name=["f", "b", "a"], position=[0.01, 2.0, 1.0])
    assert command_values(msg, ["a", "b"], "f") == ([1.0, 2.0], 0.02)
    assert command_values(msg, ["a", "b"], None) == ([1.0, 2.0], None)
    arm_only = JointState(name=["a", "b"], position=[1.0, 2.0])
    assert command_values(arm_only, ["a", "b"], "f") == ([1.0, 2.0], None)
    assert command_values(JointState(name=["a"], position=[1.0]), ["a", "b"], "f") is None
    no_width = JointState(name=["a", "b", "f"], position=[1.0, 2.0])  # a named joint lacks it
    assert command_values(no_width, ["a", "b"], "f") is None


def test_arm_commands_for_each_interface():
    arm = np.array([1.0, 2.0])
    assert list(arm_command_msg("forward_position", ["a", "b"], arm, 0.012).data) == [1.0, 2.0]
    msg = arm_command_msg("trajectory", ["a", "b"], arm, 0.012)
    assert to_seconds(msg.header.stamp) == 0.0 and list(msg.joint_names) == ["a", "b"]
    assert [to_seconds(p.time_from_start) for p in msg.points] == [0.012]
    assert list(msg.points[0].positions) == [1.0, 2.0]


def test_checked_chunk_keeps_its_stamp_unless_retimed():
    msg = chunk_msg(["a"], 10.0, [0.1, 0.2], [[0.0], [1.0]], "req:3")
    times, positions = np.array([0.125, 0.375]), np.array([[0.0], [0.5]])
    kept = checked_chunk_msg(msg, Verdict(CLIP, (), {}, times, positions, 10.0))
    assert kept.header.stamp == msg.header.stamp and kept.header.frame_id == "req:3"
    assert [to_seconds(p.time_from_start) for p in kept.points] == [0.125, 0.375]
    assert [list(p.positions) for p in kept.points] == [[0.0], [0.5]]
    moved = checked_chunk_msg(msg, Verdict(CLIP, (), {}, times, positions, 10.25))
    assert to_seconds(moved.header.stamp) == 10.25


def test_chunk_events_are_json_with_numpy_numbers():
    msg = chunk_msg(["a"], 4.5, [0.1], [[0.0]], "req:9")
    verdict = Verdict(CLIP, ("slowed",), {"time_scale": np.float64(1.5), "points": np.int64(3)})
    pending = PendingChunk(2, msg, to_seconds(msg.header.stamp), msg.header.frame_id, 0.0)
    event = json.loads(event_json(chunk_report(pending, verdict, 0.75), "chunk_check"))
    assert event == {"source": "chunk_check", "event": "chunk", "chunk": 2, "stamp": 4.5,
                     "request": "req:9", "check_ms": 0.75, "verdict": "clip",
                     "reasons": ["slowed"], "time_scale": 1.5, "points": 3}  # fmt: skip
    assert list(event)[0] == "source"
    assert refused_request(event_json({**event, "verdict": "veto"}, "chunk_check")) == 9
