"""Helpers for tests that start a stack with `vla-runtime launch` and talk to it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

ARM = [f"fr3_joint{i}" for i in range(1, 8)]
HOME = np.array([0.0, -np.pi / 4, 0.0, -3 * np.pi / 4, 0.0, np.pi / 2, np.pi / 4])


def start_launcher(*args: str, stack: str = "sim") -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.cli", "launch", stack, "--quiet", *args],
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

    def collect(self, msg_type, topic: str, qos=10) -> list:
        """Subscribe `topic`; the returned list fills with the messages as they arrive."""
        received: list = []
        self.node.create_subscription(msg_type, topic, received.append, qos)
        return received

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
        # Until /clock arrives (it is discovered separately from /joint_states) sim time reads 0.
        assert self.spin_until(lambda: self.sim_now() > 0.0, timeout), "no /clock"
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
        assert self.spin_until(lambda: self.jtc.get_subscription_count() > 0, 60), "no driver"
        self.jtc.publish(msg)

    def close(self) -> None:
        self.node.destroy_node()
        self.ctx.try_shutdown()
