"""The ROS boundary's codecs: joint states, commands, requests, safety events."""

import json

import numpy as np
from sensor_msgs.msg import JointState

from vla_runtime.core.streaming.streamer import Request, Setpoint
from vla_runtime.ros.messages import (
    REQUEST_PREFIX,
    command_msg,
    joint_state_values,
    parse_request_id,
    refused_request,
    request_msg,
    to_seconds,
)


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


def test_joint_state_values_in_the_asked_order():
    msg = JointState(name=["b", "a", "c"], position=[2.0, 1.0, 3.0], velocity=[0.2, 0.1, 0.3])
    assert joint_state_values(msg, ["a", "b"]) == ([1.0, 2.0], [0.1, 0.2])
    msg.velocity = [0.2]  # not one per name: no velocities
    assert joint_state_values(msg, ["a", "b"]) == ([1.0, 2.0], None)
    assert joint_state_values(msg, ["a", "d"]) is None
    short = JointState(name=["a", "b"], position=[1.0])
    assert joint_state_values(short, ["b"]) is None
    assert joint_state_values(short, ["a"]) == ([1.0], None)


def test_command_is_stamped_with_the_command_time():
    setpoint = Setpoint(2.000000001, np.array([1.0, 2.0]), np.array([0.5, 0.0]), None, False)
    msg = command_msg(["a", "b"], setpoint)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (2, 1)
    assert list(msg.name) == ["a", "b"]
    assert list(msg.position) == [1.0, 2.0] and list(msg.velocity) == [0.5, 0.0]
