"""The safety node's latch over real DDS: it survives a crash and restart, only the operator's
reset service (with a stated reason) clears it, the gate then re-arms from the measured state,
a driver's reflex latches it, and a future-stamped joint state cannot blind the watchdog."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, String
from test_safety_node import HOME, NAMES, WAIT_S, Probe, stamp_of, start_safety, stop_safety

from vla_runtime.core import topics
from vla_runtime.ros.qos import LATCHED

pytestmark = pytest.mark.integration

NUDGE = np.eye(len(HOME))[0]  # joint 1


class LatchProbe(Probe):
    """The safety probe that also records the latch on /vla/estop/state and plays a driver's
    events."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.latch_states = self.record(Bool, topics.ESTOP_STATE, LATCHED, lambda m: m.data,
                                        stamped=False)  # fmt: skip
        self.driver_events = self.node.create_publisher(String, topics.DRIVER_EVENTS, 10)

    def events_of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def commanding(self, q, condition, what: str) -> None:
        """Command `q` (the measured state: None) until `condition()`."""

        def step() -> bool:
            self.command(self.arm if q is None else q)
            return condition()

        self.spin_until(step, what)

    def arm_gate(self) -> None:
        """Until the gate follows commands at the measured state (it sends arm commands)."""
        self.wait_for_state()
        sent = len(self.outputs)
        self.commanding(None, lambda: len(self.outputs) > sent, "the gate to arm")

    def wait_latched(self, latched: bool) -> None:
        self.spin_until(lambda: self.latch_states and self.latch_states[-1] is latched,
                        f"/vla/estop/state {latched}")  # fmt: skip


def wait_for_node(probe: LatchProbe, states_before: int = 0) -> None:
    """Until a (re)started node demonstrably runs: it published its latch state (one more than
    `states_before`) and its events reach us."""
    probe.spin_until(lambda: len(probe.latch_states) > states_before, "the node's latch state",
                     state=False)  # fmt: skip
    probe.spin_until(lambda: probe.command_pub.get_subscription_count() > 0, "safety", state=False)
    probe.spin_until(lambda: probe.events_sub.get_publisher_count() > 0, "events", state=False)


@pytest.fixture
def latch_probe(rclpy_context, tmp_path):
    proc = start_safety(tmp_path)
    probe = LatchProbe(rclpy_context)
    try:
        wait_for_node(probe)
        assert probe.latch_states[-1] is False
        yield probe
    finally:
        probe.close()
        print(stop_safety(proc))


def test_the_latch_survives_a_crash_and_only_a_reset_with_a_reason_clears_it(
    rclpy_context, tmp_path
):
    latch_file = tmp_path / "latch.json"
    proc = start_safety(tmp_path)
    probe = LatchProbe(rclpy_context)
    try:
        wait_for_node(probe)
        probe.arm_gate()
        probe.run(0.3, command=lambda t: probe.arm)
        probe.estop_pub.publish(Bool(data=True))
        probe.wait_latched(True)
        recorded = json.loads(latch_file.read_text())
        assert recorded["kind"] == "estop" and recorded["robot"] == "fr3"
        assert "/vla/estop" in recorded["reason"]

        proc.kill()  # SIGKILL: no chance to save anything on the way out
        probe.run(0.3, state=False)  # take what it sent before it died
        states = len(probe.latch_states)
        probe.outputs.clear()
        probe.events.clear()
        proc.start()
        wait_for_node(probe, states)
        assert probe.latch_states[-1] is True  # it starts latched
        # Commands at the measured state reach the node and are refused, for the latch.
        probe.commanding(None, lambda: any(
            "latched" in e.get("reason", "") for e in probe.events_of("command_rejected")
        ), "a command refused for the latch")  # fmt: skip
        probe.run(0.5, command=lambda t: probe.arm)
        assert probe.outputs == []

        refused = probe.reset(None)
        assert not refused.success and topics.OPERATOR_REASON in refused.message
        probe.run(0.5, command=lambda t: probe.arm)
        assert probe.outputs == [] and probe.latch_states[-1] is True

        answer = probe.reset("test: arm inspected after the restart")
        assert answer.success, answer.message
        probe.wait_latched(False)
        recorded = json.loads(latch_file.read_text())
        assert recorded["kind"] is None and "arm inspected" in recorded["reason"]
        start = probe.arm.copy()
        probe.commanding(start, lambda: bool(probe.outputs), "the gate to re-arm")
        assert np.abs(probe.outputs[0][1] - start).max() < 1e-9  # from the measured state
        reset = probe.events_of("operator_reset")
        assert reset and reset[0]["cleared"] == "estop"
    finally:
        probe.close()
        output = stop_safety(proc)
        print(output)
    assert "starts latched" in output and "arm inspected after the restart" in output


def test_after_a_reset_the_gate_re_arms_from_the_measured_state_not_the_old_target(latch_probe):
    probe = latch_probe
    probe.arm_gate()
    start = probe.arm.copy()
    probe.run(1.0, command=lambda t: start + 0.1 * t * NUDGE)
    target = start + 0.1 * NUDGE
    probe.run(0.3, command=lambda t: target)
    probe.estop_pub.publish(Bool(data=True))
    probe.wait_latched(True)
    # Meanwhile the arm was moved by hand, 0.2 rad away from where the gate held it.
    probe.follow = False
    probe.arm = probe.outputs[-1][1] - 0.2 * NUDGE
    probe.run(0.3)
    answer = probe.reset("test: arm moved by hand")
    assert answer.success, answer.message
    probe.wait_latched(False)
    sent = len(probe.outputs)
    probe.events.clear()
    # The old target agrees with the gate's last output, not with the arm: refused.
    probe.commanding(target, lambda: len(probe.outputs) > sent or any(
        "rad from the arm" in e.get("reason", "") for e in probe.events_of("arm_rejected")
    ), "the old target refused")  # fmt: skip
    probe.run(0.3, command=lambda t: target)
    assert len(probe.outputs) == sent, "the gate moved toward the old target"
    # A command at the measured state arms it, from there.
    measured = probe.arm.copy()
    probe.commanding(measured, lambda: len(probe.outputs) > sent, "the gate to arm at the arm")
    assert np.abs(probe.outputs[sent][1] - measured).max() < 1e-9


def test_a_driver_reflex_latches_the_gate_until_the_operator_recovers(latch_probe, ros_domain):
    probe = latch_probe
    probe.arm_gate()
    start = probe.arm.copy()
    probe.run(0.3, command=lambda t: start + 0.1 * t * NUDGE)
    reflex = {"event": "reflex", "topic": "/forward_position_controller/commands",
              "reason": "joint_velocity_violation", "fault": "joint_velocity_violation",
              "stamp": probe.now()}  # fmt: skip
    probe.driver_events.publish(String(data=json.dumps(reflex)))
    probe.spin_until(lambda: probe.events_of("driver_fault"), "the driver fault reported")
    probe.wait_latched(True)
    fault = probe.events_of("driver_fault")[0]
    assert fault["fault"] == "joint_velocity_violation"
    # The plan goes on; the gate stops and holds.
    probe.run(1.0, command=lambda t: start + 0.1 * (0.3 + t) * NUDGE)
    tail = np.array([q for _, q in probe.outputs[-20:]])
    assert np.abs(np.diff(tail, axis=0)).max() == 0.0
    held = tail[-1]
    probe.run(0.5, command=lambda t: held + 0.01 * t * NUDGE)
    assert np.abs(probe.outputs[-1][1] - held).max() == 0.0
    # The operator's command, as from a shell on the stack's domain (no driver serves recovery).
    recover = subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.cli", "recover", "--reason", "test: driver recovered",
         "--domain", str(ros_domain.domain_id), "--timeout", str(WAIT_S)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    probe.spin_until(lambda: recover.poll() is not None, "vla-runtime recover to finish")
    out = recover.stdout.read()
    assert recover.returncode == 0, out
    assert f"{topics.DRIVER_RECOVER}: no driver serves it; skipped" in out
    assert f"{topics.ESTOP_RESET}: done: cleared driver joint_velocity_violation" in out, out
    probe.wait_latched(False)
    probe.run(0.5, command=lambda t: held + 0.05 * t * NUDGE)
    assert probe.outputs[-1][1][0] > held[0] + 0.005


def test_a_future_stamped_joint_state_then_silence_still_stops_the_gate(latch_probe):
    probe = latch_probe
    probe.arm_gate()
    start = probe.arm.copy()
    probe.run(0.3, command=lambda t: start + 0.1 * t * NUDGE)
    probe.events.clear()
    # One joint state stamped 10 s ahead, then none: commands keep coming.
    msg = JointState(name=NAMES, position=[*probe.arm.tolist(), 0.04])
    msg.header.stamp.sec, msg.header.stamp.nanosec = stamp_of(probe.now() + 10.0)
    probe.state_pub.publish(msg)
    silence = time.monotonic()

    def holding_and_lost() -> bool:
        probe.command(probe.outputs[-1][1])
        return bool(probe.events_of("state_lost"))

    probe.spin_until(holding_and_lost, "state_lost", state=False)
    print(f"state_lost {time.monotonic() - silence:.2f} s after the future-stamped state")
    probe.run(0.5, command=lambda t: probe.outputs[-1][1], state=False)
    tail = np.array([q for _, q in probe.outputs[-20:]])
    assert np.abs(np.diff(tail, axis=0)).max() == 0.0
