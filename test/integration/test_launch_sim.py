"""Issue 2 acceptance: `vla-runtime launch sim` brings up the sim driver and two camera nodes as
separate processes over real DDS, measures them, and stops cleanly (or fails loudly)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.integration

ARM = [f"fr3_joint{i}" for i in range(1, 8)]
HOME = np.array([0.0, -np.pi / 4, 0.0, -3 * np.pi / 4, 0.0, np.pi / 2, np.pi / 4])


def start_launcher(*args: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.cli", "launch", "sim", "--quiet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    first = proc.stdout.readline()
    match = re.search(r"ROS_DOMAIN_ID=(\d+)", first)
    assert match, f"launcher did not announce its domain: {first!r}"
    return proc, int(match.group(1))


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=30)
    return proc.returncode, out


class Probe:
    """A test-side node on the launched stack's domain (sim time)."""

    def __init__(self, domain_id: int):
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.parameter import Parameter
        from sensor_msgs.msg import JointState
        from std_msgs.msg import String
        from trajectory_msgs.msg import JointTrajectory

        os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain_id)
        self.node = rclpy.create_node(
            "launch_probe",
            context=self.ctx,
            parameter_overrides=[Parameter("use_sim_time", value=True)],
        )
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.q: np.ndarray | None = None
        self.events: list[dict] = []
        self.node.create_subscription(JointState, "/joint_states", self._on_state, 10)
        self.node.create_subscription(
            String, "/vla/driver/events", lambda m: self.events.append(json.loads(m.data)), 10
        )
        self.jtc = self.node.create_publisher(
            JointTrajectory, "/fr3_arm_controller/joint_trajectory", 10
        )

    def _on_state(self, msg) -> None:
        index = {n: i for i, n in enumerate(msg.name)}
        self.q = np.array([msg.position[index[n]] for n in ARM])

    def spin_until(self, condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.executor.spin_once(timeout_sec=0.05)
            if condition():
                return True
        return False

    def sim_now(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def spin_sim_seconds(self, seconds: float, timeout: float = 60.0) -> None:
        end = self.sim_now() + seconds
        assert self.spin_until(lambda: self.sim_now() >= end, timeout), "sim time stalled"

    def send(self, names, points) -> None:
        from builtin_interfaces.msg import Duration
        from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

        msg = JointTrajectory()
        msg.joint_names = list(names)
        for t, q in points:
            point = JointTrajectoryPoint()
            point.positions = [float(v) for v in q]
            point.time_from_start = Duration(sec=int(t), nanosec=int((t % 1) * 1e9))
            msg.points.append(point)
        self.jtc.publish(msg)

    def close(self) -> None:
        self.node.destroy_node()
        self.ctx.try_shutdown()


def test_launch_sim_moves_the_arm_reports_rates_and_stops_cleanly(tmp_path):
    report_path = tmp_path / "run.json"
    proc, domain = start_launcher("--duration", "20", "--report", str(report_path))
    probe = None
    try:
        probe = Probe(domain)
        assert probe.spin_until(lambda: probe.q is not None, 60), "no /joint_states"
        assert np.allclose(probe.q, HOME, atol=0.02)

        goal = HOME + np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.2, 0.3])
        probe.send(ARM, [(1.0, HOME + (goal - HOME) / 2), (2.0, goal)])
        probe.spin_sim_seconds(3.5)
        assert np.max(np.abs(probe.q - goal)) < 0.01, probe.q - goal

        # Malformed commands are rejected with an event and the arm keeps holding the goal.
        probe.send(ARM[:6], [(1.0, goal[:6])])  # wrong joint count
        probe.send(ARM, [(1.0, np.full(7, np.nan))])  # NaN
        probe.send(list(reversed(ARM)) + ["bogus"], [(1.0, np.zeros(8))])  # unknown joint
        assert probe.spin_until(lambda: len(probe.events) >= 3, 30), probe.events
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
    assert report["topics"]["/joint_states"]["rate_hz"] >= 100.0
    for camera in ("scene", "wrist"):
        assert report["topics"][f"/vla/cameras/{camera}/image_raw"]["rate_hz"] >= 10.0
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
        assert probe.spin_until(lambda: probe.q is not None, 60)
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
        assert probe.spin_until(lambda: probe.q is not None, 60)
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
