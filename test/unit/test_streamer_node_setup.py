"""The streamer node: it logs the lifecycle's notices of every severity from one process (rclpy
refuses a call site that logs at two severities, and that error killed the node), and leads its
commands by the whole delay to the arm."""

import pytest
import rclpy
from rclpy.parameter import Parameter

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


def test_commands_lead_by_the_driver_delay_plus_the_gates_trajectory_lookahead():
    rclpy.init()
    try:
        for interface, led, lead in (("trajectory", True, 0.026 + 6 * 0.01),
                                     ("trajectory", False, 0.026),
                                     ("forward_position", True, 0.026)):  # fmt: skip
            node = StreamerNode(parameter_overrides=[
                Parameter("control_rate_hz", value=100.0),
                Parameter("driver_delay_s", value=0.026),
                Parameter("command_interface", value=interface),
                Parameter("trajectory_lookahead", value=6.0),
                Parameter("lead_trajectory_lookahead", value=led),
            ])  # fmt: skip
            try:
                assert node.config.driver_delay_s == pytest.approx(lead)
                assert node.config.arm_only_delay_s == pytest.approx(lead - 0.026)
            finally:
                node.close()
                node.destroy_node()
    finally:
        rclpy.shutdown()
