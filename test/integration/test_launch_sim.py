"""`vla-runtime launch sim` brings up the sim driver and two camera nodes as
separate processes over real DDS, measures them, and stops cleanly (or fails loudly)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import numpy as np
import pytest
from stack_probe import ARM, HOME, PROBE_COMMANDS, Probe, finish, start_launcher
from tf2_msgs.msg import TFMessage

from vla_runtime.core import topics
from vla_runtime.ros.qos import STATIC_TRANSFORM_LISTENER

pytestmark = pytest.mark.integration


def static_frames(messages: list[TFMessage]) -> set[tuple[str, str]]:
    return {(t.header.frame_id, t.child_frame_id) for m in messages for t in m.transforms}


def test_launch_sim_moves_the_arm_reports_rates_and_stops_cleanly(tmp_path):
    report_path = tmp_path / "run.json"
    proc, domain = start_launcher("--duration", "20", "--report", str(report_path), *PROBE_COMMANDS)
    probe = None
    try:
        probe = Probe(domain, commands=True)
        static = []
        probe.node.create_subscription(
            TFMessage, topics.TF_STATIC, static.append, STATIC_TRANSFORM_LISTENER
        )
        assert probe.wait(lambda: probe.q is not None, 60), "no /joint_states"
        assert np.allclose(probe.q, HOME, atol=0.02)
        # The cameras' calibrated poses (calibration/sim) reach tf2's topic.
        assert probe.wait(lambda: len(static_frames(static)) == 2, 30), static_frames(static)
        assert static_frames(static) == {
            ("fr3_link0", "scene_optical_frame"),
            ("fr3_link8", "wrist_optical_frame"),
        }

        goal = HOME + np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.2, 0.3])
        probe.send(ARM, [(1.0, HOME + (goal - HOME) / 2), (2.0, goal)])
        probe.spin_sim_seconds(3.5)
        assert np.max(np.abs(probe.q - goal)) < 0.01, probe.q - goal

        # Malformed commands are rejected with an event and the arm keeps holding the goal.
        probe.send(ARM[:6], [(1.0, goal[:6])])  # wrong joint count
        probe.send(ARM, [(1.0, np.full(7, np.nan))])  # NaN
        probe.send(list(reversed(ARM)) + ["bogus"], [(1.0, np.zeros(8))])  # unknown joint
        assert probe.wait(lambda: len(probe.events) >= 3, 30), probe.events
        assert all(e["event"] == "rejected" and e["reason"] for e in probe.events)
        probe.spin_sim_seconds(1.0)
        assert np.max(np.abs(probe.q - goal)) < 0.01
    finally:
        if probe is not None:
            probe.close()
        code, out = finish(proc, timeout=180)
    assert code == 0, out
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["clock"] == "sim" and report["duration_s"] >= 20.0
    # Rates in sim time. /joint_states is published at exactly 100 Hz of it; the monitor takes
    # it best effort (a loaded host may lose some), never more than it.
    assert 80.0 <= report["topics"]["/joint_states"]["rate_hz"] <= 101.0
    for camera in ("scene", "wrist"):
        # Frames all through the run, at camera_fps (15) of sim time at most (give or take the
        # monitor's receipt times), not at the scene states' 50: how many a loaded host renders
        # is the benchmark's figure.
        images = report["topics"][f"/vla/cameras/{camera}/image_raw"]
        assert images["count"] >= report["duration_s"] and 0.0 < images["rate_hz"] <= 18.0
        latency = report["cameras"][camera]["latency_ms"]
        assert 0.0 <= latency["p50"] <= latency["p99"]
    assert 1 <= report["topics"]["/vla/driver/events"]["count"] <= 3  # best-effort monitor
    assert {n: v["clean"] for n, v in report["nodes"].items()} == {
        "sim_driver": True,
        "scene_camera": True,
        "wrist_camera": True,
    }


def test_sigterm_stops_every_node_cleanly():
    proc, domain = start_launcher()
    probe = Probe(domain)
    try:
        assert probe.wait(lambda: probe.q is not None, 60)
    finally:
        probe.close()
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, timeout=60)
    assert code == 0, out
    assert "stopped cleanly" in out and "unclean" not in out and "died" not in out


def test_a_dying_node_is_reported_and_fails_the_launch():
    proc, domain = start_launcher("--duration", "120")
    probe = Probe(domain)
    try:
        assert probe.wait(lambda: probe.q is not None, 60)
    finally:
        probe.close()
    victim = subprocess.run(
        ["pgrep", "-P", str(proc.pid), "-f", "__node:=wrist_camera"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert victim, "wrist camera process not found"
    os.kill(int(victim[0]), signal.SIGKILL)
    code, out = finish(proc, timeout=60)
    assert code != 0
    assert re.search(r"node wrist_camera\s+exit -9\s+died", out), out
