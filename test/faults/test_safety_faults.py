"""Fault injection against the safety node (separate processes, real DDS).

For every fault: nothing beyond the limits reaches the driver topic, the arm command stops
changing within timeout + deceleration once fresh commands stop, and every chunk gets exactly
one verdict.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_safety_node import (  # noqa: E402
    HOME,
    NAMES,
    Probe,
    assert_output_within_limits,
    chunk_msg,
    stamp_of,
    start_safety,
    stop_safety,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def node(rclpy_context, tmp_path):
    proc = start_safety(tmp_path)
    probe = Probe(rclpy_context)
    try:
        probe.spin_until(lambda: probe.command_pub.get_subscription_count() > 0, "subscription")
        probe.spin_until(lambda: probe.chunk_pub.get_subscription_count() > 0, "chunk sub")
        # Its event publisher must have matched our reader before the first verdict goes out.
        probe.spin_until(lambda: probe.events_sub.get_publisher_count() > 0, "safety events")
        probe.wait_for_state()  # chunks and commands then meet a known arm
        yield probe, proc
    finally:
        probe.close()
        print(stop_safety(proc))


def garbage_stream(seed: int):
    """Mostly a smooth motion, with NaN/Inf, far out of range and 0.5 rad steps mixed in."""
    rng = np.random.default_rng(seed)

    def command(t):
        if t > 2.0:
            return None
        q = HOME.copy()
        q[0] += 0.3 * math.sin(2.0 * t)
        roll = rng.random()
        if roll < 0.05:
            q[rng.integers(7)] = rng.choice([math.nan, math.inf, -math.inf])
        elif roll < 0.10:
            q[rng.integers(7)] = rng.choice([-10.0, 10.0])
        elif roll < 0.15:
            q[rng.integers(7)] += rng.choice([-0.5, 0.5])
        return q

    return command


def test_nan_inf_out_of_range_and_step_commands(node):
    probe, proc = node
    probe.run(3.0, command=garbage_stream(0))
    assert proc.poll() is None
    assert len(probe.outputs) > 200
    assert_output_within_limits(probe.outputs)
    kinds = probe.kinds()
    assert "command_rejected" in kinds and "command_clamped" in kinds
    stopped = next(e for e in probe.events if e["event"] == "stopped")
    print(f"garbage stream: stop_ms {stopped['stop_ms']:.1f}, decel_ms {stopped['decel_ms']:.1f}")
    # Once silent, the output holds within timeout + deceleration (2.62 rad/s / 10 rad/s^2).
    last_change = max(
        t for (t, a), (_, b) in zip(probe.outputs, probe.outputs[1:], strict=False)
        if np.abs(a - b).max() > 0
    )  # fmt: skip
    assert stopped["stop_ms"] <= 100.0 + 262.0 + 2 * 4.0
    assert probe.outputs[-1][0] - last_change > 0.5


def test_malformed_messages_on_every_input(node):
    probe, proc = node

    # Joint state with missing names / short arrays; commands with wrong names or lengths.
    # Joint state is best effort, and the node's reader may match our writer a moment after
    # our writer matched it: repeat the bad states until one is reported.
    def bad_states_reported() -> bool:
        probe.state_pub.publish(JointState(name=NAMES[:3], position=[0.0] * 3))
        probe.state_pub.publish(JointState(name=NAMES, position=[0.0] * 2))
        probe.run(0.02, state=False)
        return "state_rejected" in probe.kinds()

    probe.spin_until(bad_states_reported, "state_rejected")
    probe.command_pub.publish(JointState(name=["x"] * 8, position=[0.0] * 8))
    probe.command_pub.publish(JointState(name=NAMES, position=[0.0]))
    # Chunks: ragged points, no points, duplicated names, negative and decreasing times.
    ragged = chunk_msg(probe.now(), [[*HOME, 0.04]] * 3)
    ragged.points[1].positions = [0.0]
    empty = JointTrajectory(joint_names=NAMES)
    dup = chunk_msg(probe.now(), [[*HOME, 0.04]] * 3, names=[*NAMES[:7], NAMES[0]])
    backwards = chunk_msg(probe.now(), [[*HOME, 0.04]] * 3)
    backwards.points[2].time_from_start.sec = 0
    backwards.points[2].time_from_start.nanosec = 0
    bad = [ragged, empty, dup, backwards]
    for msg in bad:
        probe.chunk_pub.publish(msg)
        probe.run(0.1)
    probe.spin_until(
        lambda: len([e for e in probe.events if e["event"] == "chunk"]) >= 4, "verdicts"
    )
    verdicts = [e for e in probe.events if e["event"] == "chunk"]
    # Vetoed, or superseded (stale) when a loaded machine checks slower than they arrive.
    assert len(verdicts) == 4 and {e["verdict"] for e in verdicts} <= {"veto", "stale"}
    assert proc.poll() is None
    assert probe.outputs == []  # nothing armed on garbage


def test_chunk_flood_every_chunk_accounted_for(node):
    probe, _ = node
    n = 40
    for _ in range(n):  # ten times faster than the engine would ever send
        probe.chunk_pub.publish(chunk_msg(probe.now(), [[*HOME, 0.04]] * 20, start=0.05))
        probe.run(0.01)
    probe.spin_until(
        lambda: len([e for e in probe.events if e["event"] == "chunk"]) >= n,
        lambda: f"{n} verdicts, got {sorted(e['chunk'] for e in probe.events if 'chunk' in e)}",
    )
    probe.run(0.5)
    verdicts = [e for e in probe.events if e["event"] == "chunk"]
    assert sorted(e["chunk"] for e in verdicts) == list(range(1, n + 1))
    # clip: a chunk whose check came so late that it starts late (re-timed; the arm held)
    counts = {v: sum(e["verdict"] == v for e in verdicts) for v in ("accept", "clip", "stale")}
    executable = counts["accept"] + counts["clip"]
    others = [(e["verdict"], e.get("reasons")) for e in verdicts if e["verdict"] not in counts]
    assert executable + counts["stale"] == n and executable >= 1, others
    assert all("re-timed" in e["reasons"][0] for e in verdicts if e["verdict"] == "clip")
    assert len(probe.checked) == executable
    print(f"flood of {n}: {counts}")


def test_frozen_joint_state_stops_the_arm_and_vetoes_chunks(node):
    probe, _ = node
    frozen = probe.now()

    def stream(t):
        q = HOME.copy()
        q[0] += 0.1 * t
        return q

    probe.run(0.5, command=stream)
    assert "armed" in probe.kinds()
    # From now on the "driver" repeats one stale stamp.
    start = time.monotonic()
    while time.monotonic() - start < 1.5:
        msg = JointState(name=NAMES, position=[*HOME.tolist(), 0.04])
        msg.header.stamp.sec, msg.header.stamp.nanosec = stamp_of(frozen)
        probe.state_pub.publish(msg)
        q = stream(0.5 + time.monotonic() - start)
        probe.command(q)
        probe.spin(0.004)
    assert "state_lost" in probe.kinds()
    probe.chunk_pub.publish(chunk_msg(probe.now(), [[*HOME, 0.04]] * 5, start=0.05))
    deadline = time.monotonic() + 60.0
    while not any(e["event"] == "chunk" for e in probe.events):  # still frozen meanwhile
        assert time.monotonic() < deadline, "no verdict"
        probe.state_pub.publish(msg)
        probe.spin(0.01)
    verdict = next(e for e in probe.events if e["event"] == "chunk")
    assert verdict["verdict"] == "veto" and "joint state too old" in verdict["reasons"][0]
    assert_output_within_limits(probe.outputs)


def test_killed_safety_node_goes_silent_and_a_restart_rearms_without_a_jump(
    rclpy_context, tmp_path
):
    # The driver's forward position controller holds its last setpoint (sim: Simulator
    # .set_forward_positions freezes it), so a dead gate leaves the arm holding, not following.
    probe = Probe(rclpy_context)
    procs = []
    try:
        for attempt in range(2):
            proc = start_safety(tmp_path / f"{attempt}")
            procs.append(proc)
            probe.spin_until(lambda: probe.command_pub.get_subscription_count() > 0, "sub")
            base = probe.arm.copy()

            first = len(probe.outputs)

            def stream(_t, base=base, first=first):
                # Like a streamer: hold the measured pose until the gate answers, then move.
                q = base.copy()
                if len(probe.outputs) > first:
                    q[0] += 0.2 * (time.monotonic() - probe.outputs[first][0])
                return q

            deadline = time.monotonic() + 60.0  # a restart on a loaded machine takes a while
            while len(probe.outputs) < first + 50 and time.monotonic() < deadline:
                probe.run(0.2, command=stream)
            assert len(probe.outputs) >= first + 50, probe.events[-5:]
            # A (re)started gate begins exactly where the arm is reported.
            assert np.abs(probe.outputs[first][1] - base).max() < 1e-3
            probe.arm = probe.outputs[-1][1].copy()  # the "driver" followed the gate
            proc.kill()
            killed_at = time.monotonic()
            probe.run(0.5, command=stream)
            after = [o for t, o in probe.outputs if t > killed_at + 0.05]
            assert after == [], "commands reached the driver after the gate died"
        assert_output_within_limits(probe.outputs[:50])
    finally:
        probe.close()
        for proc in procs:
            stop_safety(proc)
