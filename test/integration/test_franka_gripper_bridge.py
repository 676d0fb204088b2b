"""The franka_ros2 gripper bridge where franka_msgs is missing (every development host: it is
not pip-installable): one clear error, no crash, commands ignored. And the franka_msgs goal
fields it fills, checked against stand-in goal classes."""

from __future__ import annotations

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


def test_goal_messages_carry_franka_msgs_fields(monkeypatch):
    def goal_class():
        return SimpleNamespace(Goal=lambda: SimpleNamespace(epsilon=SimpleNamespace()))

    monkeypatch.setattr(bridge, "Move", goal_class())
    monkeypatch.setattr(bridge, "Grasp", goal_class())
    move = bridge.FrankaGripperBridge._goal_message(GripperGoal("move", 0.08, 0.05))
    assert (move.width, move.speed) == (0.08, 0.05)
    grasp = bridge.FrankaGripperBridge._goal_message(
        GripperGoal("grasp", 0.0, 0.05, 20.0, 0.005, 0.08)
    )
    assert (grasp.width, grasp.speed, grasp.force) == (0.0, 0.05, 20.0)
    assert (grasp.epsilon.inner, grasp.epsilon.outer) == (0.005, 0.08)
