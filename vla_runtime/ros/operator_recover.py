"""`vla-runtime recover`: the operator's way out of a stop, with a stated reason. Publishes the
reason on /vla/operator/reason (transient local), asks the driver to recover from its reflex or
protective stop (/vla/driver/recover, when a driver serves it), then clears the safety gate's
latch (/vla/estop/reset). One line per step; a refused step ends the command with exit code 1.
"""

from __future__ import annotations

import time

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String
from std_srvs.srv import Trigger

from vla_runtime.core import topics
from vla_runtime.ros.qos import LATCHED

DRIVER_GRACE_S = 1.0  # s a driver's service may appear after the safety node's
# In the refusal of a call whose reason has not reached the server (ros/operator_service.py).
REFUSED_FOR_REASON = "state a reason"
RETRY_S = 0.2


def recover_main(reason: str, domain_id: int | None, timeout_s: float, out=print) -> int:
    """Run the steps; `out` takes each line. Returns the exit code."""
    context = Context()
    rclpy.init(args=[], context=context, domain_id=domain_id)
    node = Node("operator_recover", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        return _recover(node, executor, reason, timeout_s, out)
    finally:
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()


def _recover(node: Node, executor, reason: str, timeout_s: float, out) -> int:
    deadline = time.monotonic() + timeout_s
    reason_pub = node.create_publisher(String, topics.OPERATOR_REASON, LATCHED)
    reason_pub.publish(String(data=reason))
    out(f"reason stated on {topics.OPERATOR_REASON}: {reason}")
    driver = node.create_client(Trigger, topics.DRIVER_RECOVER)
    reset = node.create_client(Trigger, topics.ESTOP_RESET)

    def spin_until(condition, until: float) -> bool:
        while not condition():
            if time.monotonic() >= until:
                return False
            executor.spin_once(timeout_sec=0.05)
        return True

    if not spin_until(reset.service_is_ready, deadline):
        out(f"{topics.ESTOP_RESET}: no safety node serves it within {timeout_s:g} s "
            "(is the stack running on this ROS_DOMAIN_ID?)")  # fmt: skip
        return 1
    spin_until(driver.service_is_ready, min(deadline, time.monotonic() + DRIVER_GRACE_S))
    steps = [(driver, topics.DRIVER_RECOVER)] if driver.service_is_ready() else []
    if not steps:
        out(f"{topics.DRIVER_RECOVER}: no driver serves it; skipped")
    steps.append((reset, topics.ESTOP_RESET))
    # Every server must hold the reason before it is asked: it subscribes to it.
    servers = len(steps)
    spin_until(lambda: reason_pub.get_subscription_count() >= servers, deadline)
    for client, service in steps:
        ok, message = call_with_reason(client, spin_until, deadline)
        out(f"{service}: {'done' if ok else 'refused'}: {message}")
        if not ok:
            return 1
    return 0


def call_with_reason(client, spin_until, deadline: float) -> tuple[bool, str]:
    """Call the Trigger service of `client` (a reason already published) until answered: a
    refusal because the reason has not reached the server yet (it travels on its own topic) is
    asked again until `deadline` (monotonic s). `spin_until(condition, until)` spins the
    client's node until `condition()` or `until`, returning `condition()`."""
    while True:
        future = client.call_async(Trigger.Request())
        if not spin_until(future.done, deadline):
            client.remove_pending_request(future)
            return False, "no answer before the timeout"
        result = future.result()
        if result.success or REFUSED_FOR_REASON not in result.message:
            return result.success, result.message
        if time.monotonic() + RETRY_S >= deadline:
            return False, result.message
        spin_until(lambda: False, time.monotonic() + RETRY_S)
