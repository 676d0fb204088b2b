"""Operator actions as std_srvs/Trigger services that need a reason: the reason is published on
/vla/operator/reason (transient local) shortly before the call, as `vla-runtime recover` does."""

from __future__ import annotations

import time
from collections.abc import Callable

from std_msgs.msg import String
from std_srvs.srv import Trigger

from vla_runtime.core import topics
from vla_runtime.core.operator_reason import OperatorReason
from vla_runtime.ros.qos import LATCHED


def reasoned_trigger(node, service: str, action: Callable[[str], tuple[bool, str]]):
    """Serve `service` on `node`: a call with a fresh reason runs `action(reason)`, which returns
    (success, message); a call without one is refused. Both are logged."""
    reason = OperatorReason()
    node.create_subscription(
        String, topics.OPERATOR_REASON, lambda msg: reason.state(msg.data, time.monotonic()),
        LATCHED,
    )  # fmt: skip

    def on_call(request, response):
        text = reason.take(time.monotonic())
        if text is None:
            response.success = False
            response.message = (
                f"{service} refused: state a reason on {topics.OPERATOR_REASON} first "
                "(vla-runtime recover --reason TEXT)"
            )
            node.get_logger().warning(response.message)
            return response
        response.success, response.message = action(text)
        # rclpy pins one severity per logging call site: one call per severity.
        if response.success:
            node.get_logger().info(f"{service} ({text}): {response.message}")
        else:
            node.get_logger().warning(f"{service} ({text}): {response.message}")
        return response

    return node.create_service(Trigger, service, on_call)
