"""The sim driver as a separate process over real DDS, in a private ROS domain. The test's
probe node stands in for the safety gate: the driver is started with it as `command_source`."""

from __future__ import annotations

import math
import re
import signal

import numpy as np
import pytest
from builtin_interfaces.msg import Duration
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String, UInt32
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_runtime.core import topics
from vla_runtime.core.robot import load_robot
from vla_runtime.ros.messages import chunk_msg, to_seconds
from vla_runtime.ros.qos import LATCHED
from vla_runtime.stack.supervisor import NodeProcess, module_process
from vla_runtime.testing.recorder import Recorder, json_data

ROBOT = load_robot("fr3")
ARM = list(ROBOT.joints)
HOME = np.array(ROBOT.home)
GOAL = HOME + np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.2, 0.3])
WAIT_S = 120.0  # wall-clock patience for DDS and a loaded machine; progress is in sim time
PROBE = "sim_driver_probe"
NO_REASON = "state a reason"  # how a recovery without a stated reason is refused


def start_driver(tmp_path, *params: str, interface: str = "trajectory", source: str = "/" + PROBE,
                 module: str = "vla_runtime.drivers.sim.node") -> NodeProcess:  # fmt: skip
    """The driver obeying `source` (the probe by default) on `interface`."""
    log = tmp_path / "sim_driver.log"
    own = [f"command_interface:={interface}", f"command_source:={source}"]
    return module_process(module, *own, *params, log_path=log).start()


def stop_driver(proc: NodeProcess) -> str:
    proc.stop(signal.SIGTERM, 20.0)
    return proc.output()


class Probe(Recorder):
    """A test-side node recording the driver's output and sending it commands on `interface`
    (the other arm interface's publisher is None) and the gripper's."""

    def __init__(self, ctx, interface: str = "trajectory", name: str = PROBE):
        super().__init__(name, context=ctx)
        keep = self.record
        self.states: list[JointState] = keep(JointState, topics.JOINT_STATES, 1000, stamped=False)
        self.clocks: list[float] = keep(
            Clock, topics.CLOCK, 1000, lambda m: _seconds(m.clock), stamped=False
        )
        self.events: list[dict] = keep(String, topics.DRIVER_EVENTS, 100, json_data, stamped=False)
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self.xml: list[str] = keep(String, topics.SIM_SCENE_XML, latched, lambda m: m.data,
                                   stamped=False)  # fmt: skip
        pub = self.node.create_publisher
        self.trajectory = self.forward = None
        if interface == "trajectory":
            self.trajectory = pub(
                JointTrajectory, topics.trajectory_command("fr3_arm_controller"), 10
            )
        else:
            self.forward = pub(
                Float64MultiArray, topics.forward_command("forward_position_controller"), 10
            )
        self.step = pub(UInt32, topics.SIM_STEP, 10)
        self.gripper = pub(Float64MultiArray, topics.forward_command("fr3_gripper"), 10)
        self.reason = pub(String, topics.OPERATOR_REASON, LATCHED)
        self.recovery = self.node.create_client(Trigger, topics.DRIVER_RECOVER)

    @property
    def sim_time(self) -> float:
        return _seconds(self.states[-1].header.stamp) if self.states else -1.0

    @property
    def arm(self) -> np.ndarray:
        return np.array(self.states[-1].position[:7])

    def spin_until(self, condition, what: str, timeout: float = WAIT_S) -> None:
        if not self.wait(condition, timeout):
            raise AssertionError(f"timed out waiting for {what}")

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

    def next_event(self, what: str) -> dict:
        """Spin until the driver publishes its next event (after those seen so far)."""
        n = len(self.events)
        self.spin_until(lambda: len(self.events) > n, what)
        return self.events[n]

    def call_recover(self) -> Trigger.Response:
        """One call of the driver's recovery service."""
        self.spin_until(self.recovery.service_is_ready, "the recovery service")
        future = self.recovery.call_async(Trigger.Request())
        self.spin_until(future.done, "the recovery service's answer")
        return future.result()

    def recover(self, reason: str = "test: the cause is gone") -> Trigger.Response:
        """Recovery with `reason` stated first. The reason and the call travel separately: a
        call that overtook its reason is refused for want of one, and is made again."""
        self.reason.publish(String(data=reason))
        self.spin_until(lambda: self.reason.get_subscription_count() > 0, "the reason's reader")
        for _ in range(20):
            response = self.call_recover()
            if response.success or NO_REASON not in response.message:
                return response
            self.wait(lambda: False, 0.1)
        return response


def _seconds(stamp) -> float:
    return to_seconds(stamp)


@pytest.mark.integration
def test_sim_driver_streams_follows_trajectories_and_rejects_bad_commands(rclpy_context, tmp_path):
    proc = start_driver(tmp_path)
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

        # Malformed commands interrupt a motion: each is rejected with an event and the arm holds
        # (a malformed forward command: test_forward_reflex_holds_until_operator_recovery).
        malformed = [
            (topics.trajectory_command("fr3_arm_controller"),
             lambda: probe.send_trajectory(["fr3_joint0", *ARM[1:]], HOME, 1.0)),
            (topics.trajectory_command("fr3_arm_controller"),
             lambda: probe.send_trajectory(ARM, [math.nan] * 7, 1.0)),
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
        output = stop_driver(proc)
    assert proc.returncode == 0, output
    assert "rejected command on /fr3_arm_controller/joint_trajectory" in output


@pytest.mark.integration
def test_lockstep_advances_only_on_request(rclpy_context, tmp_path):
    proc = start_driver(tmp_path, "lockstep:=true")
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
        probe.wait(lambda: False, 1.0)  # nothing moves without a request
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
        output = stop_driver(proc)
    assert proc.returncode == 0, output


def holds_at(probe: Probe, q, seconds: float = 0.5) -> None:
    probe.spin_sim(seconds)
    assert np.abs(probe.arm - q).max() < 0.01, probe.arm - q


def recover(probe: Probe) -> None:
    response = probe.recover()
    assert response.success, response.message
    event = next(e for e in reversed(probe.events) if e["event"] == "recovered")
    assert event["fault"].startswith("joint_velocity") and event["reason"].startswith("test:")


JOINT2 = np.eye(7)[1]  # fr3_joint2


@pytest.mark.integration
def test_trajectory_reflex_holds_until_operator_recovery(rclpy_context, tmp_path):
    """Motion faster than FR3's joint velocity limit (fr3_joint2: 2.62 rad/s) trips a latched
    joint_velocity_violation, like libfranka: the arm holds and every command is refused until
    the operator's recovery, which needs a stated reason and re-arms from the measured pose."""
    proc = start_driver(tmp_path)
    probe = Probe(rclpy_context)
    jtc = topics.trajectory_command("fr3_arm_controller")
    gripper = topics.forward_command("fr3_gripper")
    try:
        probe.spin_until(lambda: len(probe.states) > 0, "/joint_states")
        for publisher in (probe.trajectory, probe.gripper):
            probe.connected(publisher)

        # Trajectory: 0.15 rad in 50 ms is 3 rad/s.
        probe.send_trajectory(ARM, HOME + 0.15 * JOINT2, 0.05)
        event = probe.next_event("the trajectory reflex")
        assert event["event"] == "reflex" and event["topic"] == jtc
        assert event["reason"] == "joint_velocity_violation: fr3_joint2 3.00 rad/s > 2.62 (limit)"
        assert event["fault"] == event["reason"]
        holds_at(probe, HOME)
        # Latched: a slow trajectory and a gripper command are refused too, naming the fault.
        for topic, send in (
            (jtc, lambda: probe.send_trajectory(ARM, HOME + 0.15 * JOINT2, 1.0)),
            (gripper, lambda: probe.gripper.publish(Float64MultiArray(data=[0.02]))),
        ):
            send()
            refused = probe.next_event(f"the refusal on {topic}")
            assert refused["event"] == "reflex" and refused["topic"] == topic
            assert (
                refused["reason"].startswith(event["fault"]) and refused["fault"] == event["fault"]
            )
        holds_at(probe, HOME, 1.0)  # nothing recovers on its own
        assert probe.states[-1].position[7] + probe.states[-1].position[8] > 0.075  # still open

        # No reason stated: refused, still latched.
        response = probe.call_recover()
        assert not response.success and NO_REASON in response.message
        probe.send_trajectory(ARM, HOME, 0.5)
        assert probe.next_event("a refusal")["event"] == "reflex"
        recover(probe)

        # Re-armed from the measured pose: a trajectory whose first point is far from it is
        # refused, not run; one that starts there runs, and then the far one does too.
        above = HOME + 0.15 * JOINT2
        probe.send_trajectory(ARM, above, 0.5)
        refused = probe.next_event("the re-arm refusal")
        assert refused["event"] == "rejected" and refused["reason"].startswith("re-arming")
        holds_at(probe, HOME)
        probe.send_trajectory(ARM, probe.arm, 0.1)
        probe.send_trajectory(ARM, above, 0.5)  # 0.3 rad/s: runs
        probe.spin_until(lambda: np.abs(probe.arm - above).max() < 0.01, "the slow trajectory")
    finally:
        probe.close()
        output = stop_driver(proc)
    assert proc.returncode == 0, output
    assert "reflex on /fr3_arm_controller/joint_trajectory: joint_velocity_violation" in output
    assert "recovered from joint_velocity_violation" in output
    assert f"/vla/driver/recover refused: state a reason on {topics.OPERATOR_REASON}" in output


@pytest.mark.integration
def test_forward_reflex_holds_until_operator_recovery(rclpy_context, tmp_path):
    """The forward position interface: a malformed command is rejected, a step beyond the
    velocity limit trips the reflex, and after the operator's recovery a command far from the
    measured pose is refused while one near it runs."""
    proc = start_driver(tmp_path, interface="forward_position")
    probe = Probe(rclpy_context, "forward_position")
    forward = topics.forward_command("forward_position_controller")
    try:
        probe.spin_until(lambda: len(probe.states) > 0, "/joint_states")
        probe.connected(probe.forward)
        probe.forward.publish(Float64MultiArray(data=list(HOME[:6])))
        rejected = probe.next_event("the malformed command's rejection")
        assert rejected["event"] == "rejected" and rejected["topic"] == forward
        holds_at(probe, HOME)

        # A slow stream runs (0.3 mrad per command: total 2.4 mrad, under 2.62 rad/s even if
        # all but the last came in one physics step), then a 0.1 rad step (>= 5 rad/s, judged
        # over at most 20 ms) trips. The reflex names the step from the setpoint the arm last
        # ran with: q, the stream (sent before it on the same topic) having been accepted, or a
        # few of its commands earlier when they came in the same physics step.
        q = HOME.copy()
        for _ in range(8):
            q = q - 0.0003 * JOINT2
            probe.forward.publish(Float64MultiArray(data=q.tolist()))
        probe.forward.publish(Float64MultiArray(data=(q - 0.1 * JOINT2).tolist()))
        event = probe.next_event("the forward reflex")
        assert event["event"] == "reflex" and event["topic"] == forward
        assert event["reason"].startswith("joint_velocity_violation: fr3_joint2 ")
        named = float(re.search(r"forward step ([0-9.]+) rad", event["reason"]).group(1))
        assert 0.1 <= named <= 0.1024, event["reason"]
        assert event["fault"] == event["reason"]
        holds_at(probe, q)
        probe.forward.publish(Float64MultiArray(data=q.tolist()))  # refused while latched
        refused = probe.next_event("the refusal on the forward topic")
        assert refused["event"] == "reflex" and refused["reason"].startswith(event["fault"])
        holds_at(probe, q)
        recover(probe)
        n_events = len(probe.events)
        # Far from the measured pose (the old target): refused, the arm stays.
        probe.forward.publish(Float64MultiArray(data=(q - 0.1 * JOINT2).tolist()))
        refused = probe.next_event("the re-arm refusal")
        assert refused["event"] == "rejected" and refused["reason"].startswith("re-arming")
        holds_at(probe, q)
        # A new stream's first step is judged over 20 ms: 0.04 rad there is 2 rad/s and runs.
        q = q - 0.04 * JOINT2
        probe.forward.publish(Float64MultiArray(data=q.tolist()))
        probe.spin_until(lambda: np.abs(probe.arm - q).max() < 0.01, "a forward command")
        holds_at(probe, q)
        assert [e["event"] for e in probe.events[n_events:]] == ["rejected"], probe.events
    finally:
        probe.close()
        output = stop_driver(proc)
    assert proc.returncode == 0, output


@pytest.mark.integration
def test_task_driver_after_a_reset_ignores_the_old_stream_and_follows_a_chunk_from_home(
    rclpy_context, tmp_path
):
    """After an episode reset the arm is home again. What was meant for the old pose is
    ignored (and reported): a "start now" command aimed at it, a trajectory stamped before the
    reset. A whole chunk as one trajectory (the lock-step evaluation sends these), stamped
    after the reset and ending far from home, runs."""
    from vla_runtime.drivers.sim.task_driver import EpisodeClient

    log = tmp_path / "task_driver.log"
    own = ("command_interface:=trajectory", f"command_source:=/{PROBE}")
    proc = module_process("vla_runtime.drivers.sim.task_driver", *own, "task:=reach", log_path=log)
    proc.start()
    probe = Probe(rclpy_context)
    episodes = EpisodeClient(probe.node)

    def spin_until(ready, timeout_s, what):
        probe.spin_until(ready, what, timeout_s)

    def chunk_from_home(stamp: float) -> JointTrajectory:
        # 0.05 s apart, from home to `away`: 0.3 rad in 0.75 s
        rows = [HOME + (away - HOME) * k / 15 for k in range(16)]
        return chunk_msg(ARM, stamp, [0.05 * k for k in range(16)], rows)

    away = HOME + np.array([0.3, 0.2, 0.0, 0.2, 0.0, 0.0, 0.0])
    try:
        probe.spin_until(lambda: len(probe.states) > 0, "/joint_states")
        probe.connected(probe.trajectory)
        probe.send_trajectory(ARM, away, 1.5)
        probe.spin_until(lambda: np.abs(probe.arm - away).max() < 0.01, "the arm away from home")
        before_reset = probe.sim_time
        episodes.reset(1, spin_until, WAIT_S, WAIT_S)
        probe.spin_until(lambda: np.abs(probe.arm - HOME).max() < 0.01, "the arm home")

        probe.send_trajectory(ARM, away + 0.01, 0.5)  # "start now", meant for the old pose
        event = probe.next_event("the ignored command")
        assert event["event"] == "ignored" and event["reason"].startswith("command from before")
        probe.trajectory.publish(chunk_from_home(before_reset))  # stamped before the reset
        probe.spin_sim(1.0)
        assert np.abs(probe.arm - HOME).max() < 0.01

        # Start it ahead: the probe's latest state is already in the past when the driver takes
        # the chunk (the sim runs on meanwhile), and a start even 10 ms in the past asks the arm
        # to jump to where the chunk is by then, which trips its reflex as a real arm's would.
        probe.trajectory.publish(chunk_from_home(probe.sim_time + 0.5))
        try:
            probe.spin_until(lambda: np.abs(probe.arm - away).max() < 0.01, "the chunk to run")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; driver events {probe.events}") from None
        assert [e["event"] for e in probe.events] == ["ignored"], probe.events
    finally:
        probe.close()
        output = stop_driver(proc)
    assert proc.returncode == 0, output
