"""`RuntimeNode`, the base of every vla_runtime node: rclpy's Node without its per-endpoint QoS
event handlers, their warnings kept by a slow check of the ROS graph.

rclpy gives every publisher and subscription two event handlers (incompatible QoS, incompatible
type) by default, and its executor rebuilds the wait set with all of them on each wake-up: on
a node with a dozen endpoints woken a few hundred times a second by /clock, joint states and
commands, they cost about a quarter of its executor time (on 2 cores, CPU the engine needs).
Their only use here is a warning when an endpoint can never match; `EndpointWatch` gives the
same warning from a graph query every few seconds on a steady clock.
"""

from __future__ import annotations

import copy

from rclpy.clock import Clock, ClockType
from rclpy.duration import Duration, Infinite
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import QoSCompatibility, qos_check_compatible
from rclpy.serialization import deserialize_message

ENDPOINT_CHECK_PERIOD_S = 3.0


def explicit_durations(qos):
    """`qos` with unspecified (0) durations written as the infinite they mean: the graph
    reports other endpoints' durations as infinite, and comparing those with 0 reports a
    mismatch that DDS does not have."""
    qos = copy.copy(qos)
    for name in ("deadline", "lifespan", "liveliness_lease_duration"):
        if getattr(qos, name) == Duration():
            setattr(qos, name, Infinite)
    return qos


def type_name(msg_type) -> str:
    """'std_msgs/msg/String' for std_msgs.msg.String, as the graph names types."""
    return f"{msg_type.__module__.split('.')[0]}/msg/{msg_type.__name__}"


class EndpointWatch:
    """Warns once per remote endpoint whose QoS or type cannot match one of `node`'s own
    (what rclpy's default event handlers would have logged)."""

    def __init__(self, node: Node):
        self.node = node
        self.warnings: list[str] = []
        self._seen: set[tuple[str, bytes]] = set()

    def check(self) -> list[str]:
        """New warnings, logged and kept in `warnings`."""
        new = []
        node = self.node
        for sub in list(node.subscriptions):
            for info in node.get_publishers_info_by_topic(sub.topic_name):
                new += self._compare(
                    sub.topic_name, sub.msg_type, info, sub.qos_profile, "publisher"
                )
        for pub in list(node.publishers):
            if pub.topic_name in ("/rosout", "/parameter_events"):
                continue
            for info in node.get_subscriptions_info_by_topic(pub.topic_name):
                new += self._compare(pub.topic_name, pub.msg_type, info, pub.qos_profile,
                                     "subscription")  # fmt: skip
        for text in new:
            node.get_logger().warning(text)
        self.warnings += new
        return new

    def _compare(self, topic, msg_type, info, own_qos, kind) -> list[str]:
        key = (topic, bytes(info.endpoint_gid))
        if key in self._seen:
            return []
        self._seen.add(key)
        other = f"a {kind} on '{topic}'"
        if not info.node_name.startswith("_NODE_NAME_UNKNOWN"):  # not yet known to the graph
            other = f"{kind} of {info.node_namespace.rstrip('/')}/{info.node_name} on '{topic}'"
        if info.topic_type != type_name(msg_type):
            return [f"{other} has type {info.topic_type}, not {type_name(msg_type)}: "
                    "no messages will pass between them"]  # fmt: skip
        own, theirs = explicit_durations(own_qos), explicit_durations(info.qos_profile)
        pair = (theirs, own) if kind == "publisher" else (own, theirs)
        compatibility, reason = qos_check_compatible(*pair)
        if compatibility == QoSCompatibility.ERROR:
            reason = reason.removeprefix("ERROR:").strip().rstrip(";")
            return [f"{other} has incompatible QoS ({reason}): no messages will pass"]
        return []


class RuntimeNode(Node):
    """A Node whose publishers and subscriptions carry no default event handlers; an
    `EndpointWatch` checks them every few seconds instead."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.endpoint_watch = EndpointWatch(self)
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(ENDPOINT_CHECK_PERIOD_S, self.endpoint_watch.check, clock=steady)

    def create_subscription(self, *args, **kwargs):
        kwargs.setdefault(
            "event_callbacks", SubscriptionEventCallbacks(use_default_callbacks=False)
        )
        return super().create_subscription(*args, **kwargs)

    def create_publisher(self, *args, **kwargs):
        kwargs.setdefault("event_callbacks", PublisherEventCallbacks(use_default_callbacks=False))
        return super().create_publisher(*args, **kwargs)

    def create_bounded_subscription(self, msg_type, topic, callback, qos, max_bytes, refuse):
        """A subscription whose messages are judged by their serialized size before they are
        deserialized: one over `max_bytes` goes to `refuse(reason)` unread (rclpy would spend
        seconds turning a 100 000-point trajectory into Python objects on the node's only
        executor thread), the rest to `callback` as messages."""

        def on_serialized(data: bytes) -> None:
            if len(data) > max_bytes:
                refuse(f"{msg_type.__name__} of {len(data)} bytes refused unread "
                       f"(at most {max_bytes})")  # fmt: skip
                return
            callback(deserialize_message(data, msg_type))

        return self.create_subscription(msg_type, topic, on_serialized, qos, raw=True)

    def now_s(self) -> float:
        """The node's clock in seconds (sim time under `use_sim_time`: 0 until the first /clock)."""
        return self.get_clock().now().nanoseconds * 1e-9
