"""The ros2_control-style command topics of the arm drivers: the controller parameters that
name them (empty = the robot's), the one arm interface and the one node (the safety gate) a
driver obeys (`CommandArbiter`, core/command_source.py), and for the direct drivers (franky,
ur_rtde) that interface feeding one `ArmCommand`, rejections logged and published on
/vla/driver/events (the arm holds). Recovery from a latched fault is an operator's
std_srvs/Trigger call on /vla/driver/recover with a reason (ros/operator_service.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.command_source import (
    COMMAND_INTERFACES,
    CommandSource,
    Publisher,
    Rearm,
    interface_roles,
    qualified_name,
    resolve_source,
)
from vla_runtime.core.direct_driver import Reconnector
from vla_runtime.core.robot import RobotConfig
from vla_runtime.ros.messages import trajectory_arguments
from vla_runtime.ros.parameters import param
from vla_runtime.ros.qos import with_liveliness

GRAPH_CHECK_PERIOD_S = 0.05  # publishers on the command topics are checked at 20 Hz
IGNORED_REPORT_EVERY = 250  # an "ignored" event for the first refused message and every n-th
# A message matched before the graph names its publisher's node (Fast DDS learns node names
# after the endpoints) waits this long to be attributed, then is refused.
DISCOVERY_GRACE_S = 0.5


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
    command_interface: str = param(
        f"the one arm command interface obeyed, one of {COMMAND_INTERFACES} (the safety gate's)",
        "forward_position",
    )
    command_source: str = param(
        "the one node whose commands are obeyed (the safety gate), fully qualified; a relative "
        "name is resolved in the driver's namespace",
        "/safety",
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


def trajectory_start(msg: JointTrajectory, joints) -> list[float] | None:
    """The arm positions of a trajectory's first point (`joints` as named on ROS), or None."""
    names = list(msg.joint_names)
    if not msg.points or not all(j in names for j in joints):
        return None
    first = msg.points[0].positions
    if len(first) != len(names):
        return None
    return [float(first[names.index(j)]) for j in joints]


class CommandArbiter:
    """The ROS side of `CommandSource` for `node`: subscribes the obeyed command topics (the
    `command_interface`'s arm topic and the gripper's, if any), checks the publishers of every
    command topic at 20 Hz and on each message whose sender is not accounted for, and passes on
    only the source's messages. A message that arrives while discovery has yet to name a matched
    publisher waits (the newest per topic, up to DISCOVERY_GRACE_S) and is passed on at the
    first check that attributes it to the source. `on_event(dict)` publishes an event;
    `on_rogue()` makes the arm hold (called once per latched fault). `interface` None: a
    gripper-only node (no arm topic)."""

    def __init__(self, node, command_topics: dict[str, str], interface: str | None, source: str,
                 on_event: Callable[[dict], None], on_rogue: Callable[[], None]):  # fmt: skip
        used, ignored = interface_roles(interface) if interface is not None else (None, None)
        self.node, self.on_event, self.on_rogue = node, on_event, on_rogue
        self.command_topics = dict(command_topics)  # role -> topic as configured
        gripper = ["gripper"] if "gripper" in command_topics else []
        self.obeyed = (used, *gripper) if used else tuple(gripper)
        resolved = {role: node.resolve_topic_name(t) for role, t in command_topics.items()}
        self.source = CommandSource(
            resolve_source(source, node.get_namespace()), resolved, self.obeyed,
            (ignored,) if ignored else (),
        )  # fmt: skip
        self._subscriptions = {}
        # role -> (since, publishers matched then, callback, message) waiting for discovery
        self._waiting: dict[str, tuple[float, int, Callable, object]] = {}
        self._ignored = 0
        node.create_timer(GRAPH_CHECK_PERIOD_S, self.check)

    @property
    def fault(self) -> dict | None:
        return self.source.fault

    def subscribe(self, role: str, msg_type, callback: Callable) -> None:
        """Subscribe `role`'s topic: `callback(msg)` gets the source's messages only."""

        def on_message(msg) -> None:
            self._waiting.pop(role, None)  # superseded
            matched = self._subscriptions[role].get_publisher_count()
            if self._admits(role, matched):
                callback(msg)
            elif self.source.identifying(role, matched):  # it may be the source's: wait
                self._waiting[role] = (time.monotonic(), matched, callback, msg)
            else:
                self._refused(role)

        topic = self.command_topics[role]
        self._subscriptions[role] = self.node.create_subscription(msg_type, topic, on_message, 10)

    def _admits(self, role: str, matched: int) -> bool:
        """Whether a message that arrived while `matched` publishers were matched is the
        source's; a publisher the last check did not see gets a fresh look first."""
        if self.source.admits(role, matched):
            return True
        self.check()
        return self.source.admits(role, matched)

    def _identifying(self, role: str) -> bool:
        return self.source.identifying(role, self._subscriptions[role].get_publisher_count())

    def _refused(self, role: str) -> None:
        self._ignored += 1
        if self._ignored % IGNORED_REPORT_EVERY == 1:
            fault = self.source.fault
            reason = (
                f"{fault['fault']} latched ({fault['node']} on {fault['topic']}): commands "
                f"refused until recovery on {topics.DRIVER_RECOVER}"
                if fault is not None
                else "a matched publisher the ROS graph has not yet named"
                if self._identifying(role)
                else "a publisher other than the command source is matched"
            )
            self.on_event({
                "event": "ignored", "topic": self.source.topics[role], "count": self._ignored,
                "reason": reason,
            })  # fmt: skip

    def check(self) -> None:
        """Judge the publishers on every command topic now; report, and hold on a rogue."""
        latched = self.source.fault is not None
        for role, topic in self.source.topics.items():
            publishers = [
                Publisher(qualified_name(info.node_namespace, info.node_name),
                          bytes(info.endpoint_gid).hex())
                for info in self.node.get_publishers_info_by_topic(topic)
            ]  # fmt: skip
            for event in self.source.observe(role, publishers):
                if event["event"] == "reflex":
                    self.node.get_logger().error(
                        f"{event['node']} publishes on {topic}: only {self.source.source} "
                        f"commands this arm; holding until recovery on {topics.DRIVER_RECOVER}"
                    )
                else:
                    self.node.get_logger().warning(
                        f"{event['node']} publishes on {topic}, which this driver does not obey "
                        f"(command_interface); the arm takes nothing from it"
                    )
                self.on_event(event)
        if not latched and self.source.fault is not None:
            self.on_rogue()
        self._pass_waiting()

    def _pass_waiting(self) -> None:
        """Pass on each waiting message the graph now attributes to the source; refuse those
        it cannot attribute in time (or attributes to no one: a fault latched)."""
        for role, (since, matched_then, callback, msg) in list(self._waiting.items()):
            # Every publisher matched when it arrived must be the source's (one that left
            # unnamed may have sent it).
            matched = max(matched_then, self._subscriptions[role].get_publisher_count())
            if self.source.admits(role, matched):
                del self._waiting[role]
                callback(msg)
            elif time.monotonic() - since > DISCOVERY_GRACE_S or not self._identifying(role):
                del self._waiting[role]
                self._refused(role)

    def clear(self) -> str | None:
        """Operator recovery of the publisher fault: why not, or None."""
        self.check()
        return self.source.clear()


class CommandTopics:
    """Mixin for a RuntimeNode with `self.command` (ArmCommand) and `self._lock`; commands are
    timed on the node's clock (`now_s()`). Obeys one interface of one source
    (`CommandArbiter`), and after a recovery re-arms from the measured pose (`Rearm`)."""

    def _subscribe_commands(self, command_topics: dict[str, str], params, measured: Callable):
        """Subscribe the obeyed arm topic of `command_topics` (`params.command_interface`, from
        `params.command_source`); the gripper's, if any, is subscribed by the driver through
        `self.arbiter`. `measured()` is where the arm holds on a rogue publisher."""
        self._event_pub = self.create_publisher(String, topics.DRIVER_EVENTS, with_liveliness(10))
        self._topics = dict(command_topics)
        self.rearm = Rearm()
        self.arbiter = CommandArbiter(
            self, command_topics, params.command_interface, params.command_source,
            self._publish_event, lambda: self._hold(measured()),
        )  # fmt: skip
        if "trajectory" in self.arbiter.obeyed:
            self.arbiter.subscribe("trajectory", JointTrajectory, self._on_trajectory)
        else:
            self.arbiter.subscribe("forward", Float64MultiArray, self._on_forward)

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        reason = self.rearm.check(trajectory_start(msg, self.command.joints))
        with self._lock:
            if reason is None:
                reason = self.command.set_trajectory(**trajectory_arguments(msg), now=self.now_s())
            else:
                self.command.hold(self.command.sample(self.now_s())[0].copy())
        self._report("trajectory", reason)

    def _on_forward(self, msg: Float64MultiArray) -> None:
        reason = self.rearm.check(list(msg.data))
        with self._lock:
            if reason is None:
                reason = self.command.set_positions(list(msg.data), now=self.now_s())
            else:
                self.command.hold(self.command.sample(self.now_s())[0].copy())
        self._report("forward", reason)

    def _report(self, command: str, reason: str | None) -> None:
        if reason is None:
            return
        topic = self._topics[command]
        self.get_logger().error(f"rejected command on {topic}: {reason}; holding")
        self._event("rejected", topic=topic, reason=reason)

    def _event(self, event: str, **fields) -> None:
        self._publish_event({"event": event, **fields})

    def _publish_event(self, event: dict) -> None:
        self._event_pub.publish(String(data=json.dumps({**event, "stamp": self.now_s()})))

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
