"""The sim driver as a separate process over real DDS, in a private ROS domain."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from builtin_interfaces.msg import Duration
from node_process import start_node, stop_node
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String, UInt32
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_runtime.core import topics
from vla_runtime.core.robot import load_robot

ROBOT = load_robot("fr3")
ARM = list(ROBOT.joints)
HOME = np.array(ROBOT.home)
GOAL = HOME + np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.2, 0.3])
WAIT_S = 120.0  # wall-clock patience for DDS and a loaded machine; progress is in sim time


def start_driver(tmp_path, *params: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "sim_driver.log"
    return start_node("vla_runtime.drivers.sim.node", log, *params), log


def stop_driver(proc: subprocess.Popen, log: Path) -> str:
    return stop_node(proc, log)[1]


class Probe:
    """A test-side node recording the driver's output and sending it commands."""

    def __init__(self, ctx):
        import rclpy

        self.node = rclpy.create_node("sim_driver_probe", context=ctx)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        self.states: list[JointState] = []
        self.clocks: list[float] = []
        self.events: list[dict] = []
        self.xml: list[str] = []
        sub = self.node.create_subscription
        sub(JointState, topics.JOINT_STATES, self.states.append, 1000)
        sub(Clock, topics.CLOCK, lambda m: self.clocks.append(_seconds(m.clock)), 1000)
        sub(String, topics.DRIVER_EVENTS, lambda m: self.events.append(json.loads(m.data)), 100)
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        sub(String, topics.SIM_SCENE_XML, lambda m: self.xml.append(m.data), latched)
        pub = self.node.create_publisher
        self.trajectory = pub(JointTrajectory, topics.trajectory_command("fr3_arm_controller"), 10)
        self.forward = pub(
            Float64MultiArray, topics.forward_command("forward_position_controller"), 10
        )
        self.step = pub(UInt32, topics.SIM_STEP, 10)

    @property
    def sim_time(self) -> float:
        return _seconds(self.states[-1].header.stamp) if self.states else -1.0

    @property
    def arm(self) -> np.ndarray:
        return np.array(self.states[-1].position[:7])

    def spin_until(self, condition, what: str, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self.executor.spin_once(timeout_sec=0.05)

    def spin_sim(self, seconds: float) -> None:
        """Spin until the driver's sim time has advanced by `seconds`."""
        until = self.sim_time + seconds
        self.spin_until(lambda: self.sim_time >= until, f"sim time {until:.3f} s")

    def connected(self, publisher) -> None:
        self.spin_until(lambda: publisher.get_subscription_count() > 0, "the driver to subscribe")

    def send_trajectory(self, names, positions, seconds: float) -> None:
        point = JointTrajectoryPoint(
            positions=[float(v) for v in positions],
            time_from_start=Duration(sec=int(seconds), nanosec=int(seconds % 1 * 1e9)),
        )
        self.trajectory.publish(JointTrajectory(joint_names=list(names), points=[point]))

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


def _seconds(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


@pytest.mark.integration
def test_sim_driver_streams_follows_trajectories_and_rejects_bad_commands(rclpy_context, tmp_path):
    proc, log = start_driver(tmp_path)
    probe = Probe(rclpy_context)
    try:
        probe.spin_until(lambda: len(probe.states) > 0, "/joint_states")
        assert list(probe.states[-1].name) == ARM + list(ROBOT.gripper_joints)
        probe.spin_until(lambda: len(probe.xml) > 0, "the latched scene XML")
        assert probe.xml[0].startswith("<mujoco")

        # Rate over sim time: independent of how fast this loaded machine runs the physics.
        first = len(probe.states)
        probe.spin_sim(1.0)
        stamps = [_seconds(m.header.stamp) for m in probe.states[first:]]
        rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
        assert rate >= 100.0, f"/joint_states at {rate:.1f} Hz of sim time"
        assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False))
        assert probe.clocks and probe.clocks[-1] >= stamps[0]

        # A JTC goal is reached within 0.01 rad (names in any order).
        probe.connected(probe.trajectory)
        probe.send_trajectory(ARM[::-1], GOAL[::-1], 1.5)
        sent_at = probe.sim_time
        probe.spin_until(
            lambda: np.abs(probe.arm - GOAL).max() < 0.01 or probe.sim_time > sent_at + 10.0,
            "the arm to settle",
        )
        assert np.abs(probe.arm - GOAL).max() < 0.01

        # Malformed commands interrupt a motion: each is rejected with an event and the arm holds.
        probe.connected(probe.forward)
        malformed = [
            (topics.trajectory_command("fr3_arm_controller"),
             lambda: probe.send_trajectory(["fr3_joint0", *ARM[1:]], HOME, 1.0)),
            (topics.trajectory_command("fr3_arm_controller"),
             lambda: probe.send_trajectory(ARM, [math.nan] * 7, 1.0)),
            (topics.forward_command("forward_position_controller"),
             lambda: probe.forward.publish(Float64MultiArray(data=list(HOME[:6])))),
        ]  # fmt: skip
        target = HOME
        for topic, send_bad in malformed:
            probe.send_trajectory(ARM, target, 3.0)
            probe.spin_sim(1.0)
            n_events = len(probe.events)
            send_bad()
            probe.spin_until(lambda n=n_events: len(probe.events) > n, f"a rejection on {topic}")
            event = probe.events[-1]
            assert event["event"] == "rejected" and event["topic"] == topic and event["reason"]
            at_rejection = probe.arm
            probe.spin_sim(0.5)
            settled = probe.arm
            probe.spin_sim(1.0)
            assert np.abs(probe.arm - settled).max() < 1e-3, "the arm keeps moving"
            assert np.abs(settled - at_rejection).max() < 0.05
            assert np.abs(probe.arm - target).max() > 0.05, "the trajectory went on"
            target = GOAL if target is HOME else HOME
    finally:
        probe.close()
        output = stop_driver(proc, log)
    assert proc.returncode == 0, output
    assert "rejected command on /fr3_arm_controller/joint_trajectory" in output


@pytest.mark.integration
def test_lockstep_advances_only_on_request(rclpy_context, tmp_path):
    proc, log = start_driver(tmp_path, "lockstep:=true")
    probe = Probe(rclpy_context)
    try:
        probe.connected(probe.step)
        probe.spin_until(lambda: len(probe.xml) > 0, "the latched scene XML")
        # One step first: its state and clock prove both streams reach us before we count.
        probe.step.publish(UInt32(data=1))
        probe.spin_until(
            lambda: probe.sim_time >= 0.001 and probe.clocks and probe.clocks[-1] >= 0.001,
            "a 1-step batch",
        )
        probe.step.publish(UInt32(data=249))
        probe.spin_until(lambda: probe.sim_time >= 0.25, "a 249-step batch")
        probe.step.publish(UInt32(data=1))
        probe.spin_until(lambda: probe.sim_time >= 0.251, "a 1-step batch")
        deadline = time.monotonic() + 1.0  # nothing moves without a request
        while time.monotonic() < deadline:
            probe.executor.spin_once(timeout_sec=0.05)
        # A 0-step request re-publishes the current state (for late subscribers), no physics.
        before = len(probe.states)
        probe.step.publish(UInt32(data=0))
        probe.spin_until(lambda: len(probe.states) > before, "the re-published state")
        assert _seconds(probe.states[-1].header.stamp) == pytest.approx(0.251, abs=1e-9)
        del probe.states[before:]
        stamps = [_seconds(m.header.stamp) for m in probe.states]
        assert [round(s * 1000) for s in stamps if s > 0][:3] == [1, 4, 8]
        assert stamps[-1] == pytest.approx(0.251, abs=1e-9)
        assert probe.clocks[-1] == pytest.approx(0.251, abs=1e-9)
        # State at every 4 ms of the batch plus its final time, nothing beyond.
        assert [round(s * 1000) for s in stamps if s > 0.2] == [204, 208, 212, 216, 220, 224,
                                                                  228, 232, 236, 240, 244, 248,
                                                                  250, 251]  # fmt: skip
    finally:
        probe.close()
        output = stop_driver(proc, log)
    assert proc.returncode == 0, output
