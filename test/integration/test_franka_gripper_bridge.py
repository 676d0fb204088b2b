"""The franka_ros2 gripper bridge where franka_msgs is missing (every development host: it is
not pip-installable): one clear error, no crash, commands ignored. The franka_msgs goal fields
it fills, checked against stand-in goal classes. Only the safety gate commands the hand: a
rogue publisher on the width topic holds it until the operator recovers."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from vla_runtime.core.gripper_intent import GripperGoal
from vla_runtime.drivers import franka_gripper_bridge as bridge


@pytest.mark.integration
def test_without_franka_msgs_one_clear_error_and_commands_are_ignored(
    rclpy_context, monkeypatch, capfd
):
    from std_msgs.msg import Float64MultiArray

    monkeypatch.setattr(bridge, "Move", None)
    monkeypatch.setattr(bridge, "Grasp", None)
    node = bridge.FrankaGripperBridge(context=rclpy_context)
    try:
        assert node.actions is None
        assert node.command_topic == "/fr3_gripper/commands"
        for width in (0.08, 0.0, 0.08):
            node._on_command(Float64MultiArray(data=[width]))
        assert node.counts == {"move": 0, "grasp": 0, "failed": 0, "ignored": 3}
    finally:
        node.destroy_node()
    logged = capfd.readouterr().err
    assert logged.count("franka_msgs is not importable") == 1, logged  # once, at start-up
    message = bridge.MISSING_FRANKA_MSGS.format(topic="/fr3_gripper/commands", namespace="/x")
    assert "franka_msgs" in message and "/x/grasp" in message and "install" in message.lower()


def goal_class():
    return SimpleNamespace(Goal=lambda: SimpleNamespace(epsilon=SimpleNamespace()))


class RecordingActionClient:
    """An action client whose server is up; it records the goals and answers none."""

    def __init__(self, sent: list, action: str):
        self.sent, self.action = sent, action

    def server_is_ready(self) -> bool:
        return True

    def send_goal_async(self, goal):
        self.sent.append((self.action, goal.width))
        return SimpleNamespace(add_done_callback=lambda callback: None)


@pytest.mark.integration
def test_a_rogue_on_the_width_topic_holds_the_hand_until_it_left_and_the_operator_recovers(
    rclpy_context, monkeypatch
):
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import Float64MultiArray, String

    from vla_runtime.core import topics
    from vla_runtime.ros.node import RuntimeNode

    monkeypatch.setattr(bridge, "Move", None)  # no franka_msgs here: stand-ins after start-up
    monkeypatch.setattr(bridge, "Grasp", None)
    node = bridge.FrankaGripperBridge(context=rclpy_context)
    monkeypatch.setattr(bridge, "Move", goal_class())
    monkeypatch.setattr(bridge, "Grasp", goal_class())
    sent = []
    node.actions = {a: RecordingActionClient(sent, a) for a in ("move", "grasp")}
    safety = RuntimeNode("safety", context=rclpy_context)
    rogue = RuntimeNode("teleop", context=rclpy_context)
    events = []
    safety.create_subscription(
        String, topics.DRIVER_EVENTS, lambda m: events.append(json.loads(m.data)), 10
    )
    gate = safety.create_publisher(Float64MultiArray, node.command_topic, 10)
    executor = SingleThreadedExecutor(context=rclpy_context)
    for each in (node, safety, rogue):
        executor.add_node(each)

    def spin_until(condition, timeout=20.0, width=None) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not condition():
            if width is not None:
                gate.publish(Float64MultiArray(data=[width]))
            executor.spin_once(timeout_sec=0.02)
        return condition()

    try:
        assert spin_until(lambda: sent == [("grasp", 0.0)], width=0.0), sent  # the gate's close
        intruder = rogue.create_publisher(Float64MultiArray, node.command_topic, 10)
        reported = lambda: [e for e in events if e["event"] == "reflex"]  # noqa: E731
        assert spin_until(reported), events
        assert reported()[0]["fault"] == "rogue_publisher" and reported()[0]["node"] == "/teleop"
        intruder.publish(Float64MultiArray(data=[0.08]))
        spin_until(lambda: False, timeout=1.0, width=0.08)  # neither opens the hand
        assert sent == [("grasp", 0.0)]
        ok, message = node._recover("teleop left running")
        assert not ok and "/teleop still publishing" in message

        rogue.destroy_publisher(intruder)
        assert spin_until(lambda: not node.arbiter.source.rogues(), timeout=20.0)
        ok, message = node._recover("teleop stopped")
        assert ok, message
        assert spin_until(lambda: len(sent) == 2, width=0.08), sent
        assert sent[1] == ("move", node.intent.config.open_width)
        services = dict(node.get_service_names_and_types())
        assert services[topics.DRIVER_RECOVER] == ["std_srvs/srv/Trigger"]
    finally:
        executor.shutdown()
        for each in (node, safety, rogue):
            each.destroy_node()


def test_goal_messages_carry_franka_msgs_fields(monkeypatch):
    monkeypatch.setattr(bridge, "Move", goal_class())
    monkeypatch.setattr(bridge, "Grasp", goal_class())
    move = bridge.FrankaGripperBridge._goal_message(GripperGoal("move", 0.08, 0.05))
    assert (move.width, move.speed) == (0.08, 0.05)
    grasp = bridge.FrankaGripperBridge._goal_message(
        GripperGoal("grasp", 0.0, 0.05, 20.0, 0.005, 0.08)
    )
    assert (grasp.width, grasp.speed, grasp.force) == (0.0, 0.05, 20.0)
    assert (grasp.epsilon.inner, grasp.epsilon.outer) == (0.005, 0.08)
