"""The node base class: no per-endpoint event handlers, and the endpoint watch still warns
about a publisher or subscription that can never match (over real DDS)."""

import time

import pytest
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import Int32, String

from vla_runtime.ros.node import RuntimeNode, type_name

pytestmark = pytest.mark.integration

RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
BEST_EFFORT = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)


def test_type_names_are_the_graphs():
    assert type_name(String) == "std_msgs/msg/String"


def test_endpoints_carry_no_event_handlers_and_mismatches_are_warned(rclpy_context):
    node = RuntimeNode("watched", context=rclpy_context)
    # Another participant, as another process would be: one participant refuses a second
    # type on a topic it already has.
    other_context = Context()
    rclpy.init(context=other_context)
    other = rclpy.create_node("other", context=other_context)
    received = []
    try:
        sub = node.create_subscription(String, "/watch/qos", received.append, RELIABLE)
        pub = node.create_publisher(Int32, "/watch/type", 10)
        assert sub.event_handlers == [] and pub.event_handlers == []
        # A best-effort publisher cannot serve a reliable subscription; a subscription of
        # another type cannot take this publisher's messages; pairs that match (default QoS,
        # reliable into best effort) must stay quiet.
        other.create_publisher(String, "/watch/qos", BEST_EFFORT)
        other.create_subscription(String, "/watch/type", lambda m: None, 10)
        node.create_subscription(Int32, "/watch/default", lambda m: None, 10)
        other.create_publisher(Int32, "/watch/default", 10)
        node.create_publisher(Int32, "/watch/default_out", 10)
        other.create_subscription(Int32, "/watch/default_out", lambda m: None, 10)
        node.create_subscription(Int32, "/watch/fine", lambda m: None, BEST_EFFORT)
        other.create_publisher(Int32, "/watch/fine", RELIABLE)
        executor = SingleThreadedExecutor(context=rclpy_context)
        executor.add_node(node)

        def discovered() -> bool:
            publishers = [node.get_publishers_info_by_topic(t) for t in ("/watch/qos",
                          "/watch/default", "/watch/fine")]  # fmt: skip
            subscriptions = [node.get_subscriptions_info_by_topic(t) for t in ("/watch/type",
                             "/watch/default_out")]  # fmt: skip
            return all(publishers) and all(subscriptions)

        deadline = time.monotonic() + 30.0
        while not discovered() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        assert discovered()
        node.endpoint_watch.check()
        warnings = node.endpoint_watch.warnings
        assert len(warnings) == 2, warnings
        qos = next(w for w in warnings if "/watch/qos" in w)
        assert "incompatible QoS (Best effort publisher and reliable subscription)" in qos, qos
        typed = next(w for w in warnings if "/watch/type" in w)
        assert "std_msgs/msg/String, not std_msgs/msg/Int32" in typed, typed
        assert node.endpoint_watch.check() == []  # each endpoint is warned about once
    finally:
        other.destroy_node()
        other_context.try_shutdown()
        node.destroy_node()
