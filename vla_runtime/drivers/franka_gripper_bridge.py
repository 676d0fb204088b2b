"""franka_ros2 gripper bridge (`vla-franka-gripper`): gate gripper widths -> franka_gripper actions.

On the franka_ros2 (ros2_control) path nothing consumes the safety gate's gripper command
(`/<gripper controller>/commands`, std_msgs/Float64MultiArray [width in m], `/fr3_gripper/commands`
for the FR3): the Franka Hand is driven by franka_gripper_node's actions. This node turns the
width stream into open / close intents (core/gripper_intent.py: hysteresis, one goal in flight)
and sends franka_msgs/action/Move (open: width, speed) and franka_msgs/action/Grasp (close:
width, epsilon.inner/outer, speed, force) goals to `<action_namespace>/move` and `/grasp`.
`action_namespace` is /franka_gripper on current franka_ros2; releases up to 0.1.x named the
node `<arm_id>_gripper` (e.g. /panda_gripper). Results and failures go to /vla/driver/events.

Only `command_source` (the safety gate) commands the hand, as with the arm drivers
(drivers/command_topics.py): any other publisher on the width topic latches `rogue_publisher`,
no goal goes out until the operator recovers through /vla/driver/recover with a reason
(`vla-runtime recover --reason TEXT`), and a rogue still publishing is a refusal.

Where franka_msgs does not import, the node logs one error naming the package and how to get it,
then keeps running and ignores the commands. Where the action servers are missing (franka_bringup's
fake hardware has none; franka_gripper not started) it says so, throttled, and sends the pending
goal once they appear.

UNTESTED HERE: the franka_msgs path (franka_msgs is not pip-installable and no Franka Hand is
available on the development hosts). The decision logic is unit-tested in
test/unit/test_gripper_intent.py; the missing-package path and the goal fields in
test/integration/test_franka_gripper_bridge.py.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.parameter import Parameter
from std_msgs.msg import Float64MultiArray, String

from vla_runtime.core import topics
from vla_runtime.core.gripper import command_refusal
from vla_runtime.core.gripper_intent import GripperGoal, GripperIntent, GripperIntentConfig
from vla_runtime.core.robot import load_robot
from vla_runtime.drivers.command_topics import CommandArbiter
from vla_runtime.ros.diagnostics import ERROR, OK, WARN, Diagnostics
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.operator_service import reasoned_trigger
from vla_runtime.ros.parameters import build, declare, joint_prefix_param, param
from vla_runtime.ros.qos import with_liveliness
from vla_runtime.ros.runtime import ThrottledLog, run_node

try:  # franka_ros2's message package: a colcon workspace or distribution package, never pip
    from franka_msgs.action import Grasp, Move
except ImportError:
    Grasp = Move = None

MISSING_FRANKA_MSGS = (
    "franka_msgs is not importable: gripper commands on {topic} are NOT sent to the Franka Hand "
    "({namespace}/move, {namespace}/grasp). Install franka_ros2's franka_msgs (build "
    "https://github.com/frankarobotics/franka_ros2 in a colcon workspace, or your distribution's "
    "ros-$ROS_DISTRO-franka-msgs package where one exists), source its install/setup.bash and "
    "restart. Running on without the gripper."
)
SEND_PERIOD_S = 0.1  # re-check for a pending goal (after a result, or once a server appears)
DOUBLE = Parameter.Type.DOUBLE


@dataclass(frozen=True)
class FrankaGripperParams:
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    joint_prefix: str = joint_prefix_param()
    command_topic: str = param("the gate's gripper widths; empty = /<the robot's gripper "
                               "controller>/commands", "")  # fmt: skip
    action_namespace: str = param("franka_gripper's: <namespace>/move, /grasp", "/franka_gripper")
    command_source: str = param("the one node whose widths are obeyed (the safety gate), fully "
                                "qualified; a relative name is resolved in the node's "
                                "namespace", "/safety")  # fmt: skip
    close_below: float | None = param("m: grasp at or below; unset = 40 % of the robot's max "
                                      "gripper width", None, DOUBLE)  # fmt: skip
    open_above: float | None = param("m: open at or above; unset = 60 % of the robot's max "
                                     "gripper width", None, DOUBLE)  # fmt: skip
    open_width: float | None = param("m the Move opens to; unset = the robot's max gripper width",
                                     None, DOUBLE)  # fmt: skip
    speed: float = param("m/s of moves and grasps", GripperIntentConfig.speed)
    force: float = param("N of a grasp", GripperIntentConfig.force)
    epsilon_inner: float = param("m a grasp may end below its width",
                                 GripperIntentConfig.epsilon_inner)  # fmt: skip
    epsilon_outer: float | None = param("m a grasp may end above its width; unset = the robot's "
                                        "max gripper width", None, DOUBLE)  # fmt: skip
    goal_timeout_s: float = param("s until a goal without a result counts as lost",
                                  GripperIntentConfig.goal_timeout_s)  # fmt: skip


class FrankaGripperBridge(RuntimeNode):
    def __init__(self, name: str = "franka_gripper_bridge", **kwargs):
        super().__init__(name, **kwargs)
        params = declare(self, FrankaGripperParams)
        robot = load_robot(params.robot, params.joint_prefix)
        if "gripper" not in robot.controllers or not robot.gripper_max_width:
            raise ValueError(f"robot {robot.name} has no gripper")
        gripper_commands = topics.forward_command(robot.controller("gripper"))
        self.command_topic = params.command_topic or gripper_commands
        self.namespace = "/" + params.action_namespace.strip("/")
        config = build(GripperIntentConfig, params, max_width=robot.gripper_max_width)
        self.intent = GripperIntent(config)
        self.counts = {"move": 0, "grasp": 0, "failed": 0, "ignored": 0}
        self._last_failure = ""
        self._warn = ThrottledLog(self.get_logger().warning, period_s=10.0)
        self._event_pub = self.create_publisher(String, topics.DRIVER_EVENTS, with_liveliness(10))
        self.diagnostics = Diagnostics(self, self.namespace)
        self.diagnostics.add_check("gripper", self._health)
        self.arbiter = CommandArbiter(
            self, {"gripper": self.command_topic}, None, params.command_source,
            self._publish_event, self.intent.hold,
        )  # fmt: skip
        self.arbiter.subscribe("gripper", Float64MultiArray, self._on_command)
        reasoned_trigger(self, topics.DRIVER_RECOVER, self._recover)
        if Move is None:
            self.actions = None
            message = MISSING_FRANKA_MSGS.format(topic=self.command_topic, namespace=self.namespace)
            self.get_logger().error(message)
            self._event("gripper_unavailable", reason="franka_msgs missing")
            return

        self.actions = {
            "move": ActionClient(self, Move, f"{self.namespace}/move"),
            "grasp": ActionClient(self, Grasp, f"{self.namespace}/grasp"),
        }
        self.create_timer(SEND_PERIOD_S, self._send_due)
        self.get_logger().info(
            f"gripper widths on {self.command_topic} -> {self.namespace}/move (open) and "
            f"{self.namespace}/grasp (close)"
        )

    def _health(self):
        """ERROR while a rogue publisher is latched or without franka_msgs, WARN while an action
        server is missing or after a failed goal (until one succeeds)."""
        values = dict(self.counts)
        rogue = self.arbiter.fault
        if rogue is not None:
            message = f"rogue_publisher {rogue['node']}: recover with {topics.DRIVER_RECOVER}"
            return ERROR, message, values
        if self.actions is None:
            return ERROR, "franka_msgs missing: gripper commands are ignored", values
        missing = [name for name, client in self.actions.items() if not client.server_is_ready()]
        if missing:
            return WARN, f"no action server for {', '.join(missing)} under {self.namespace}", values
        if self._last_failure:
            return WARN, f"last goal failed: {self._last_failure}", values
        return OK, "gripper action servers ready", values

    # -- commands ----------------------------------------------------------------------------
    def _on_command(self, msg: Float64MultiArray) -> None:
        if self.actions is None:  # already said once why
            self.counts["ignored"] += 1
            return
        reason = command_refusal(msg.data) or self.intent.command(float(msg.data[0]))
        if reason is not None:
            self.counts["ignored"] += 1
            self._warn(f"{self.command_topic}: {reason}; ignored")
            return
        self._send_due()

    def _send_due(self) -> None:
        goal = self.intent.due(time.monotonic())
        if goal is None or self.arbiter.fault is not None:
            return
        client = self.actions[goal.action]
        if not client.server_is_ready():
            self._warn(
                f"no action server on {self.namespace}/{goal.action}: is franka_gripper running "
                "(franka_bringup's fake hardware has none)? The goal goes out once it appears."
            )
            return
        token = self.intent.mark_sent(goal, time.monotonic())
        self.counts[goal.action] += 1
        self._event("gripper_goal", action=goal.action, width=goal.width)
        future = client.send_goal_async(self._goal_message(goal))
        future.add_done_callback(lambda f: self._on_goal_response(goal, token, f))

    @staticmethod
    def _goal_message(goal: GripperGoal):
        if goal.action == "move":
            msg = Move.Goal()
        else:
            msg = Grasp.Goal()
            msg.force = goal.force
            msg.epsilon.inner = goal.epsilon_inner
            msg.epsilon.outer = goal.epsilon_outer
        msg.width = goal.width
        msg.speed = goal.speed
        return msg

    def _on_goal_response(self, goal: GripperGoal, token: int, future) -> None:
        try:
            handle = future.result()
        except Exception as exc:
            return self._failed(goal, token, f"send failed: {exc!r}")
        if handle is None or not handle.accepted:
            return self._failed(goal, token, "goal rejected")
        handle.get_result_async().add_done_callback(
            lambda f: self._on_result(goal, token, f)
        )  # fmt: skip

    def _on_result(self, goal: GripperGoal, token: int, future) -> None:
        try:
            response = future.result()
        except Exception as exc:
            return self._failed(goal, token, f"no result: {exc!r}")
        result = response.result
        if response.status != GoalStatus.STATUS_SUCCEEDED or not result.success:
            error = getattr(result, "error", "") or f"status {response.status}"
            return self._failed(goal, token, error)
        self.intent.finished(token)
        self._last_failure = ""
        self._event("gripper_done", action=goal.action, width=goal.width)

    def _failed(self, goal: GripperGoal, token: int, reason: str) -> None:
        self.intent.finished(token)
        self.counts["failed"] += 1
        self._last_failure = f"{goal.action}: {reason}"
        self.get_logger().warning(f"gripper {goal.action} (width {goal.width} m): {reason}")
        self._event("gripper_failed", action=goal.action, width=goal.width, reason=reason)

    def _recover(self, reason: str) -> tuple[bool, str]:
        """The operator's recovery of a rogue_publisher latch: refused while a rogue remains."""
        fault, refusal = self.arbiter.fault, self.arbiter.clear()
        if refusal is not None:
            self._event("recovery_refused", why=refusal, reason=reason)
            return False, f"recovery refused: {refusal}"
        self._event("recovered", fault=fault and fault["fault"], reason=reason)
        return True, "recovered; gripper widths from the command source are obeyed again"

    def _event(self, event: str, **fields) -> None:
        self._publish_event({**fields, "event": event})

    def _publish_event(self, fields: dict) -> None:
        fields = {**fields, "stamp": self.now_s()}
        self._event_pub.publish(String(data=json.dumps(fields)))


def main(argv: list[str] | None = None) -> int:
    return run_node(FrankaGripperBridge, argv)


if __name__ == "__main__":
    sys.exit(main())
