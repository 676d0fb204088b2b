"""The streamer node logs the lifecycle's notices of every severity from one process: rclpy
refuses a call site that logs at two severities, and that error killed the node."""

import rclpy

from vla_runtime.core.streaming.lifecycle import INFO, REPEATED, WARNING, Notice
from vla_runtime.nodes.streamer import StreamerNode


def test_notices_of_every_severity_are_logged_in_turn():
    rclpy.init()
    node = StreamerNode()
    try:
        for level in (INFO, WARNING, REPEATED, INFO, WARNING):
            node._log(Notice(level, f"a {level} notice"))
        node._log(None)
    finally:
        node.close()
        node.destroy_node()
        rclpy.shutdown()
