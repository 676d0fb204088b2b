"""The ros2_control-style command topics of the direct drivers (franky, ur_rtde): a
JointTrajectoryController topic and a forward position `commands` topic feeding one
`ArmCommand`, rejections logged and published on /vla/driver/events (the arm holds)."""

from __future__ import annotations

import json

from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.ros.messages import to_seconds


class CommandTopics:
    """Mixin for an rclpy Node with `self.command` (ArmCommand), `self._lock` and `_now()`."""

    def _subscribe_commands(self, trajectory_controller: str, forward_controller: str) -> None:
        self._event_pub = self.create_publisher(String, topics.DRIVER_EVENTS, 10)
        self._topics = {
            "trajectory": topics.trajectory_command(trajectory_controller),
            "forward": topics.forward_command(forward_controller),
        }
        self.create_subscription(
            JointTrajectory, self._topics["trajectory"], self._on_trajectory, 10
        )
        self.create_subscription(Float64MultiArray, self._topics["forward"], self._on_forward, 10)

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        points = msg.points
        with self._lock:
            reason = self.command.set_trajectory(
                list(msg.joint_names),
                [list(p.positions) for p in points],
                [to_seconds(p.time_from_start) for p in points],
                velocities=[list(p.velocities) for p in points],
                accelerations=[list(p.accelerations) for p in points],
                start_time=to_seconds(msg.header.stamp),
                now=self._now(),
            )
        self._report("trajectory", reason)

    def _on_forward(self, msg: Float64MultiArray) -> None:
        with self._lock:
            reason = self.command.set_positions(list(msg.data), now=self._now())
        self._report("forward", reason)

    def _report(self, command: str, reason: str | None) -> None:
        if reason is None:
            return
        topic = self._topics[command]
        self.get_logger().error(f"rejected command on {topic}: {reason}; holding")
        self._event("rejected", topic=topic, reason=reason)

    def _event(self, event: str, **fields) -> None:
        fields.update(event=event, stamp=self._now())
        self._event_pub.publish(String(data=json.dumps(fields)))
