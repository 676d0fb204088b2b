"""The ur_rtde driver node, with the real ur_rtde client library, against a UR controller peer
that speaks RTDE, the dashboard server and the script interfaces (vla_runtime/testing/ur_peer.py).
The peer records every register command the control interface sends, so these tests check what
would reach a UR: servoJ targets within the UR5e's limits and speeds, the speed scaling the
controller reports republished, and a protective stop stopping all commanding until the
operator's recovery after the stop is unlocked. The probe stands in for the safety gate.

The peer follows servoJ with a simple model, not a UR's servo filter: motion checks here are about
the commands, not about how a real arm would track them.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import numpy as np
import pytest
from std_msgs.msg import Float64, Float64MultiArray, String
from std_srvs.srv import Trigger

from vla_runtime.bench.driver import DriverProbe, stop_process
from vla_runtime.core import topics
from vla_runtime.core.robot import load_robot
from vla_runtime.core.speed_scaling import UR_SPEED_SCALING_TOPIC
from vla_runtime.core.ur_servo import ServoParams
from vla_runtime.ros.operator_recover import call_with_reason
from vla_runtime.ros.qos import LATCHED
from vla_runtime.stack.supervisor import module_process
from vla_runtime.testing.ur_peer import URPeer, dashboard_command

pytestmark = pytest.mark.integration

UR5E = load_robot("ur5e")
HOME = np.array(UR5E.home)
LOWER, UPPER = np.array(UR5E.position_min), np.array(UR5E.position_max)
VMAX = np.array(UR5E.velocity)
# Speeds are judged over windows this long, as the packets arrive (in bunches on a busy host),
# the last one allowed to arrive this much earlier than its place in the stream.
SPEED_WINDOW_S, ARRIVAL_SLACK_S = 0.1, 0.03
MAX_CYCLE_S = 0.05  # a driver cycle that ran this late moves its target this much farther


def start_driver(peer: URPeer, interface: str):
    return module_process(
        "vla_runtime.drivers.ur_rtde_driver", f"robot_ip:={peer.host}", "robot:=ur5e",
        f"command_interface:={interface}", "command_source:=/driver_probe",
        node_name="ur_driver",
    ).start()  # fmt: skip


def window_speeds(commands) -> np.ndarray:
    """Per joint, the largest |dq| / (dt + slack) of servoJ targets SPEED_WINDOW_S apart."""
    t = np.array([c.t for c in commands])
    q = np.array([c.servo_target for c in commands])
    worst = np.zeros(6)
    for i in range(len(t)):
        j = np.searchsorted(t, t[i] + SPEED_WINDOW_S)
        if j >= len(t):
            break
        worst = np.maximum(worst, np.abs(q[j] - q[i]) / (t[j] - t[i] + ARRIVAL_SLACK_S))
    return worst


def wait(probe: DriverProbe, condition, timeout: float, what: str, driver=None) -> None:
    if not probe.spin_until(condition, timeout):
        tail = driver.output()[-3000:] if driver is not None else ""
        raise AssertionError(f"timed out waiting for {what}; events {probe.events}\n{tail}")


@pytest.fixture
def peer():
    with URPeer(HOME, joint_speed_max=VMAX, unlock_delay_s=1.0) as peer:
        yield peer


@pytest.fixture
def probe(rclpy_context):
    probe = DriverProbe(rclpy_context, list(UR5E.joints), UR5E.controllers)
    probe.scaling = []
    probe.node.create_subscription(
        Float64, UR_SPEED_SCALING_TOPIC, lambda m: probe.scaling.append(m.data), 10
    )
    yield probe
    probe.close()


def test_servoj_targets_stay_within_the_ur5e_limits_and_speeds(peer, probe):
    driver = start_driver(peer, "trajectory")
    try:
        wait(probe, lambda: probe.q is not None, 60, "/joint_states", driver)
        wait(probe, lambda: probe.events, 30, "the driver's publisher check", driver)
        assert np.allclose(probe.q, HOME), probe.q  # the state is the peer's, through RTDE
        assert peer.program_running  # the control script was uploaded and runs
        dashboard = [command for command, _ in peer.dashboard]
        assert "PolyscopeVersion" in dashboard and "is in remote control" in dashboard

        # Elbow towards its limit (pi) and the rest along a wave, at up to ~1.1 rad/s.
        goal = HOME + np.array([0.5, -0.3, 1.45, 0.4, -0.5, 0.6])
        mark = time.monotonic()
        probe.send_chunk([1.0, 2.0], [(HOME + goal) / 2, goal])
        wait(probe, lambda: np.abs(probe.q - goal).max() < 0.01, 20, "the arm at the goal")
        moving = [c for c in peer.servo_commands() if c.t >= mark]
        assert len(moving) > 500, len(moving)  # ~500 Hz over the 2 s move
        targets = np.array([c.servo_target for c in moving])
        assert np.all(targets >= LOWER) and np.all(targets <= UPPER)
        speeds = window_speeds(moving)
        assert np.all(speeds <= VMAX) and speeds.max() > 0.5, speeds  # it moved, within limits
        steps = np.abs(np.diff(targets, axis=0)).max(axis=0)
        assert np.all(steps <= VMAX * MAX_CYCLE_S), steps  # no jump between two servoJ calls
        assert np.abs(targets[-1] - goal).max() < 1e-9
        servo = ServoParams()
        for c in moving:  # speed, acceleration, time, lookahead, gain as the driver's
            assert c.doubles[6:11] == pytest.approx(
                (servo.speed, servo.acceleration, servo.period_s, servo.lookahead_s, servo.gain)
            )

        # Past the elbow's limit: refused, the arm holds, no target leaves the limits.
        mark = time.monotonic()
        beyond = goal.copy()
        beyond[2] = 3.3
        probe.send_chunk([1.0], [beyond])
        wait(probe, lambda: any(e["event"] == "rejected" for e in probe.events), 10, "refusal")
        wait(probe, lambda: len([c for c in peer.servo_commands() if c.t >= mark]) > 100, 10,
             "servoJ while holding")  # fmt: skip
        held = [c for c in peer.servo_commands() if c.t >= mark]
        assert np.abs(np.array([c.servo_target for c in held]) - goal).max() < 1e-6

        # Speed scaling: the pendant slider times the controller's own scaling, in percent.
        wait(probe, lambda: probe.scaling and probe.scaling[-1] == 100.0, 10, "100 %")
        peer.set_speed(slider=0.5, runtime=0.6)
        wait(probe, lambda: probe.scaling[-1] == pytest.approx(30.0), 10, "30 %")
        peer.set_speed(runtime=0.0)  # the controller pauses the arm: 0 %, not the slider
        wait(probe, lambda: probe.scaling[-1] == 0.0, 10, "0 %")
        assert peer.unsupported == []
    finally:
        code, out = stop_process(driver)
    assert code == 0, out[-3000:]
    assert not peer.program_running  # the driver's close() stopped the control script


def recover(probe: DriverProbe, reason: str) -> tuple[bool, str]:
    """The operator's /vla/driver/recover call with a stated reason."""
    reason_pub = probe.node.create_publisher(String, topics.OPERATOR_REASON, LATCHED)
    reason_pub.publish(String(data=reason))
    client = probe.node.create_client(Trigger, topics.DRIVER_RECOVER)
    try:
        assert probe.spin_until(client.service_is_ready, 10), "no recovery service"
        probe.spin_until(lambda: reason_pub.get_subscription_count() > 0, 10)
        return call_with_reason(
            client, lambda c, until: probe.spin_until(c, until - time.monotonic()),
            time.monotonic() + 20,
        )  # fmt: skip
    finally:
        probe.node.destroy_client(client)
        probe.node.destroy_publisher(reason_pub)


def wave_stream(probe: DriverProbe):
    """`stream(seconds)`: forward position commands at 50 Hz along a slow wave from home, as a
    gate streams them."""
    start = time.monotonic()

    def stream(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            offset = 0.1 * math.sin(math.pi * (time.monotonic() - start))
            probe.forward.publish(Float64MultiArray(data=(HOME + offset).tolist()))
            probe.spin_for(0.02)

    return stream


def quiet_after(probe: DriverProbe, peer: URPeer, stream) -> int:
    """After the driver reported a stop (it has acted on it): while the gate streams on for 2 s,
    no command package reaches the controller once those already under way are in (1 s). A
    driver still calling servoJ sends ~500 a second, even to an ended program (ur_rtde then
    clears the command register instead). Returns the number of packages received."""
    stream(1.0)
    sent = len(peer.commands)
    stream(1.0)
    assert [c.kind for c in peer.commands[sent:]] == []
    return sent


@contextmanager
def servoing(peer: URPeer, probe: DriverProbe, seconds: float, least: int):
    """A forward-position driver on the peer, fed a wave for `seconds` (more than `least` servoJ
    packages arrive); yields the wave's stream. The driver must then exit cleanly."""
    driver = start_driver(peer, "forward_position")
    try:
        wait(probe, lambda: probe.q is not None, 60, "/joint_states", driver)
        wait(probe, lambda: probe.events, 30, "the driver's publisher check", driver)
        stream = wave_stream(probe)
        stream(seconds)
        assert len(peer.servo_commands()) > least
        yield stream
    finally:
        code, out = stop_process(driver)
    assert code == 0, out[-3000:]


def test_a_protective_stop_ends_commanding_until_unlocked_and_recovered(peer, probe):
    with servoing(peer, probe, 2.0, 300) as stream:
        assert np.ptp([c.servo_target for c in peer.servo_commands()], axis=0).min() > 0.05

        peer.protective_stop()

        def reflexes() -> list[str]:
            return [e["fault"] for e in probe.events if e["event"] == "reflex"]

        # The stop ends the program too: a servoJ refused before the safety bits were read may
        # report that first.
        wait(probe, lambda: "protective_stopped" in reflexes(), 5, "the reflex")
        assert set(reflexes()) <= {"protective_stopped", "control_script_stopped"}, reflexes()
        sent = quiet_after(probe, peer, stream)
        held_q = probe.q.copy()
        assert np.abs(held_q - peer.q).max() < 1e-3  # states still flow while it holds

        # The operator's recovery while the stop is still active is refused.
        ok, message = recover(probe, "test: too early")
        assert not ok and "still active" in message, message

        # Unlocked (the controller refuses within 1 s of the stop here, 5 s on a UR).
        while (reply := dashboard_command(peer.host, "unlock protective stop")) != (
            "Protective stop releasing"
        ):
            assert reply.startswith("Cannot unlock"), reply
            probe.spin_for(0.1)
        wait(probe, lambda: any(e["event"] == "stop_cleared" for e in probe.events), 5, "clear")
        scripts = len(peer.scripts)
        stream(1.0)  # a cleared stop resumes nothing
        assert len(peer.commands) == sent
        assert len(peer.scripts) == scripts and not peer.program_running

        ok, message = recover(probe, "test: arm inspected")
        assert ok, message
        assert len(peer.scripts) == scripts + 1  # the control script, uploaded again
        wait(probe, lambda: peer.program_running, 5, "the control script running")
        # servoJ resumes, holding the measured pose; a command far from it is refused until one
        # starts there.
        mark = time.monotonic()
        probe.events.clear()
        for _ in range(25):
            probe.forward.publish(Float64MultiArray(data=(held_q + 0.3).tolist()))
            probe.spin_for(0.02)
        assert any("re-arming" in e.get("reason", "") for e in probe.events), probe.events
        held = [c.servo_target for c in peer.servo_commands() if c.t > mark]
        assert len(held) > 50 and np.abs(np.array(held) - held_q).max() < 1e-9
        target = held_q + 0.02  # within the re-arm tolerance of the measured pose
        probe.forward.publish(Float64MultiArray(data=target.tolist()))
        wait(probe, lambda: np.abs(peer.servo_commands()[-1].servo_target - target).max() < 1e-9,
             5, "the accepted command")  # fmt: skip
        wait(probe, lambda: np.abs(peer.q - target).max() < 1e-3, 5, "the arm moving again")
        assert peer.unsupported == []


def test_a_control_script_stopped_without_a_safety_stop_is_a_fault(peer, probe):
    """The program stopped from the dashboard (or the pendant): no safety bit changes, but servoJ
    no longer reaches the arm. The driver must say so and stop, not report "servoing"."""
    with servoing(peer, probe, 1.0, 200) as stream:
        assert dashboard_command(peer.host, "stop") == "Stopped"
        wait(probe, lambda: any(e["event"] == "reflex" for e in probe.events), 5, "the reflex")
        reflex = next(e for e in probe.events if e["event"] == "reflex")
        assert reflex["fault"] == "control_script_stopped", reflex
        quiet_after(probe, peer, stream)

        ok, message = recover(probe, "test: program stopped on purpose")
        assert ok, message
        assert peer.program_running  # the recovery waited for the re-uploaded script
        probe.events.clear()
        mark = time.monotonic()
        wait(probe, lambda: len([c for c in peer.servo_commands() if c.t > mark]) > 100, 10,
             "servoJ holding the measured pose again")  # fmt: skip
        assert not [e for e in probe.events if e["event"] == "reflex"], probe.events
