"""The sim driver obeys one node (here the probe, standing in for the safety gate) on one arm
interface: another node publishing on a command topic latches "rogue_publisher" and the arm
holds through its 1 rad step; the gripper likewise; the interface not configured moves nothing.
Real DDS, the real MuJoCo driver process."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from std_msgs.msg import Float64MultiArray
from test_sim_driver import ARM, Probe, start_driver, stop_driver
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.ros.messages import chunk_msg
from vla_runtime.testing.recorder import Recorder

pytestmark = pytest.mark.integration

JTC = topics.trajectory_command("fr3_arm_controller")
FORWARD = topics.forward_command("forward_position_controller")
GRIPPER = topics.forward_command("fr3_gripper")
STEP = np.eye(7)[0]  # 1 rad on fr3_joint1


def still(probe: Probe, start: np.ndarray, while_doing, sim_seconds: float = 1.0) -> float:
    """Run `while_doing()` every 10 ms of wall time for `sim_seconds` of sim time; the largest
    deviation of the arm from `start` meanwhile (rad)."""
    until, worst = probe.sim_time + sim_seconds, 0.0
    n = len(probe.states)
    while probe.sim_time < until:
        while_doing()
        probe.wait(lambda: False, 0.01)
        for msg in probe.states[n:]:
            worst = max(worst, float(np.abs(np.array(msg.position[:7]) - start).max()))
        n = len(probe.states)
    return worst


def fingers(probe: Probe) -> float:
    return float(probe.states[-1].position[7] + probe.states[-1].position[8])


def events_of(probe: Probe, kind: str, topic: str) -> list[dict]:
    return [e for e in probe.events if e["event"] == kind and e.get("topic") == topic]


@contextmanager
def driver_beside_a_rogue(rclpy_context, tmp_path):
    """The sim driver (trajectory interface) commanded by the probe, and a second node; yields
    (probe, rogue, log): `log` gets the driver's output once it exited cleanly."""
    proc = start_driver(tmp_path)
    probe = Probe(rclpy_context)
    rogue = Recorder("rogue_node", context=rclpy_context)
    log: list[str] = []
    try:
        probe.spin_until(lambda: len(probe.states) > 0, "/joint_states")
        probe.connected(probe.trajectory)
        yield probe, rogue, log
    finally:
        rogue.close()
        probe.close()
        log.append(stop_driver(proc))
    assert proc.returncode == 0, log[0]


def test_a_rogue_publisher_latches_a_fault_and_moves_nothing(rclpy_context, tmp_path):
    with driver_beside_a_rogue(rclpy_context, tmp_path) as (probe, rogue, log):
        start = probe.arm

        # A second node streams a 1 rad step on joint 1 at the arm's command topic.
        rogue_jtc = rogue.node.create_publisher(JointTrajectory, JTC, 10)
        step = chunk_msg(ARM, 0.0, [0.5], [start + STEP])
        worst = still(probe, start, lambda: rogue_jtc.publish(step))
        assert worst < 1e-3, f"the arm moved {worst:.4f} rad"
        (event,) = [e for e in probe.events if e.get("fault") == "rogue_publisher"]
        assert event["event"] == "reflex" and event["topic"] == JTC
        assert event["node"] == "/rogue_node" and event["source"] == "/sim_driver_probe"
        # Latched: the source's own commands are refused too while it lasts.
        probe.send_trajectory(ARM, start + 0.01 * STEP, 0.2)
        probe.spin_sim(0.5)
        assert np.abs(probe.arm - start).max() < 1e-3
        # No recovery while the rogue is there, even with a reason.
        response = probe.recover()
        assert not response.success and "rogue_node still publishing" in response.message
        probe.spin_sim(0.5)
        assert np.abs(probe.arm - start).max() < 1e-3
    assert "/rogue_node publishes on /fr3_arm_controller/joint_trajectory" in log[0]


def test_a_rogue_on_the_gripper_topic_holds_until_it_left_and_the_operator_recovers(
    rclpy_context, tmp_path
):
    with driver_beside_a_rogue(rclpy_context, tmp_path) as (probe, rogue, _):
        start, opened = probe.arm, fingers(probe)
        assert opened > 0.075
        # The rogue closes the hand: it stays open, and the arm still.
        rogue_gripper = rogue.node.create_publisher(Float64MultiArray, GRIPPER, 10)
        close = Float64MultiArray(data=[0.0])
        worst = still(probe, start, lambda: rogue_gripper.publish(close))
        assert worst < 1e-3 and abs(fingers(probe) - opened) < 1e-3, fingers(probe)
        (event,) = [e for e in probe.events if e.get("fault") == "rogue_publisher"]
        assert event["event"] == "reflex" and event["topic"] == GRIPPER
        assert event["node"] == "/rogue_node"
        # Gone, and nothing resumes until the operator's recovery; then the source's command
        # near the measured pose runs.
        rogue.node.destroy_publisher(rogue_gripper)
        probe.spin_until(
            lambda: probe.gripper.get_subscription_count() == 1
            and not probe.node.get_publishers_info_by_topic(GRIPPER)[1:],
            "the rogue to leave",
        )  # fmt: skip
        near = start + 0.03 * STEP
        probe.send_trajectory(ARM, near, 0.3)
        probe.spin_sim(0.5)
        assert np.abs(probe.arm - start).max() < 1e-3
        response = probe.recover()
        assert response.success, response.message
        probe.send_trajectory(ARM, near, 0.3)
        probe.spin_until(lambda: np.abs(probe.arm - near).max() < 0.005, "the source's command")


def test_the_interface_not_configured_moves_nothing_and_is_reported(rclpy_context, tmp_path):
    proc = start_driver(tmp_path)  # the trajectory interface
    probe = Probe(rclpy_context)
    try:
        probe.spin_until(lambda: len(probe.states) > 0, "/joint_states")
        probe.connected(probe.trajectory)
        start = probe.arm
        # The source itself on the forward topic: nothing is subscribed to take it.
        forward = probe.node.create_publisher(Float64MultiArray, FORWARD, 10)
        step = Float64MultiArray(data=(start + STEP).tolist())
        worst = still(probe, start, lambda: forward.publish(step))
        assert worst < 1e-3, f"the arm moved {worst:.4f} rad"
        assert forward.get_subscription_count() == 0
        (event,) = events_of(probe, "unused_interface", FORWARD)
        assert event["node"] == "/sim_driver_probe"
        assert not [e for e in probe.events if e["event"] == "reflex"], probe.events
        # The configured interface still works.
        probe.node.destroy_publisher(forward)
        near = start + 0.03 * STEP
        probe.send_trajectory(ARM, near, 0.3)
        probe.spin_until(lambda: np.abs(probe.arm - near).max() < 0.005, "the source's command")
    finally:
        probe.close()
        output = stop_driver(proc)
    assert proc.returncode == 0, output
