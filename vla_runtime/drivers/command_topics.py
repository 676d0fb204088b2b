"""The ros2_control-style command topics of the arm drivers: the controller parameters that
name them (empty = the robot's), and for the direct drivers (franky, ur_rtde) a
JointTrajectoryController topic and a forward position `commands` topic feeding one
`ArmCommand`, rejections logged and published on /vla/driver/events (the arm holds)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.direct_driver import Reconnector
from vla_runtime.core.robot import RobotConfig
from vla_runtime.ros.messages import trajectory_arguments
from vla_runtime.ros.parameters import param


def _controller_param(what: str, key: str):
    return param(f"{what}; empty = the robot's ({key} in config/robots/<robot>.yaml)", "")


@dataclass(frozen=True)
class ArmControllerParams:
    """The controllers whose command topics an arm driver offers."""

    trajectory_controller: str = _controller_param(
        "JointTrajectoryController: /<name>/joint_trajectory", "controllers.trajectory"
    )
    forward_controller: str = _controller_param(
        "forward position controller: /<name>/commands", "controllers.forward_position"
    )

    def command_topics(self, robot: RobotConfig) -> dict[str, str]:
        trajectory = robot.controller("trajectory", self.trajectory_controller)
        forward = robot.controller("forward_position", self.forward_controller)
        return {
            "trajectory": topics.trajectory_command(trajectory),
            "forward": topics.forward_command(forward),
        }


@dataclass(frozen=True)
class ArmGripperControllerParams(ArmControllerParams):
    """The controllers of an arm driver that also drives a gripper (commanded in width, m)."""

    gripper_controller: str = _controller_param(
        "gripper controller: /<name>/commands (width in m)", "controllers.gripper"
    )

    def command_topics(self, robot: RobotConfig) -> dict[str, str]:
        gripper = robot.controller("gripper", self.gripper_controller)
        return {**super().command_topics(robot), "gripper": topics.forward_command(gripper)}


class CommandTopics:
    """Mixin for a RuntimeNode with `self.command` (ArmCommand) and `self._lock`; commands are
    timed on the node's clock (`now_s()`)."""

    def _subscribe_commands(self, command_topics: dict[str, str]) -> None:
        """Subscribe the trajectory and forward topics of `command_topics` (more, such as the
        gripper's, are the driver's own)."""
        self._event_pub = self.create_publisher(String, topics.DRIVER_EVENTS, 10)
        self._topics = dict(command_topics)
        self.create_subscription(
            JointTrajectory, self._topics["trajectory"], self._on_trajectory, 10
        )
        self.create_subscription(Float64MultiArray, self._topics["forward"], self._on_forward, 10)

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        with self._lock:
            reason = self.command.set_trajectory(**trajectory_arguments(msg), now=self.now_s())
        self._report("trajectory", reason)

    def _on_forward(self, msg: Float64MultiArray) -> None:
        with self._lock:
            reason = self.command.set_positions(list(msg.data), now=self.now_s())
        self._report("forward", reason)

    def _report(self, command: str, reason: str | None) -> None:
        if reason is None:
            return
        topic = self._topics[command]
        self.get_logger().error(f"rejected command on {topic}: {reason}; holding")
        self._event("rejected", topic=topic, reason=reason)

    def _event(self, event: str, **fields) -> None:
        fields.update(event=event, stamp=self.now_s())
        self._event_pub.publish(String(data=json.dumps(fields)))

    def _hold(self, q) -> None:
        """Hold at the measured `q`: never resume towards a target set before a stop or loss."""
        with self._lock:
            self.command.hold(q)

    def _reconnect_holding(self, reconnector: Reconnector, connect: Callable, measured: Callable):
        """One attempt to `connect()` again; once connected, hold at the `measured()` position."""
        try:
            connect()
        except Exception as exc:
            reconnector.lost(time.monotonic())
            self._event("reconnect_failed", reason=str(exc), state=reconnector.state)
            return
        self._hold(measured())
        reconnector.connected()
        self._event("reconnected")
