"""Helpers for tests that start a stack with `vla-runtime launch` and talk to it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from vla_runtime.testing.recorder import Recorder, json_data

ARM = [f"fr3_joint{i}" for i in range(1, 8)]
HOME = np.array([0.0, -np.pi / 4, 0.0, -3 * np.pi / 4, 0.0, np.pi / 2, np.pi / 4])
UR = [
    "shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint", "wrist_2_joint",
    "wrist_3_joint",
]  # fmt: skip
UR_HOME = np.array([0.0, -np.pi / 2, np.pi / 2, -np.pi / 2, -np.pi / 2, 0.0])


PROBE_NODE = "launch_probe"
# Stack arguments for a probe that commands the arm itself (no safety gate): the driver obeys
# only the publisher its command_source names, on one interface.
PROBE_COMMANDS = (f"command_source:=/{PROBE_NODE}", "command_interface:=trajectory")


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


class Probe(Recorder):
    """A test-side recorder on the launched stack's domain (sim time): the arm's joints (named
    with `joint_prefix`), driver events; sends trajectories to the arm controller (`jtc`: its
    name, under `namespace`) when made with `commands=True`."""

    joints = ARM

    def __init__(
        self, domain_id: int, jtc: str = "fr3_arm_controller", namespace: str = "",
        joint_prefix: str = "", commands: bool = False,
    ):  # fmt: skip
        from sensor_msgs.msg import JointState
        from std_msgs.msg import String
        from trajectory_msgs.msg import JointTrajectory

        os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
        super().__init__(PROBE_NODE, domain_id=domain_id, use_sim_time=True)
        self.q: np.ndarray | None = None
        self.joints = [joint_prefix + name for name in self.joints]
        self.state_names: list[str] = []  # of the latest joint state
        self.events = self.record(String, "/vla/driver/events", 10, json_data, stamped=False)
        self.node.create_subscription(JointState, f"{namespace}/joint_states", self._on_state, 10)
        # A publisher on a driver's command topic that is not its command_source latches a
        # rogue_publisher fault, even one that never publishes: only a probe that commands the
        # arm (the stack's command_source) has one, from the start, so that the driver knows it
        # (by node name) before the first trajectory.
        self.jtc_topic = f"{namespace}/{jtc}/joint_trajectory"
        self.jtc = None
        self._driver_knows_us = False
        if commands:
            self.jtc = self.node.create_publisher(JointTrajectory, self.jtc_topic, 10)

    def _on_state(self, msg) -> None:
        self.state_names = list(msg.name)
        index = {n: i for i, n in enumerate(msg.name)}
        self.q = np.array([msg.position[index[n]] for n in self.joints])

    def moves_to(self, goal: np.ndarray, seconds: float = 2.0) -> bool:
        """Send a trajectory from the current position to `goal` and report whether the arm
        is there (1 cm) after it ends."""
        start = self.q.copy()
        points = [(seconds / 2, start + (goal - start) / 2), (seconds, goal)]
        # Sent again until the arm starts: a driver drops a publisher's messages until its graph
        # names the publisher's node, which a loaded host can delay past the first send.
        deadline = time.monotonic() + 60.0
        self.send(self.joints, points)
        while not self.wait(lambda: np.max(np.abs(self.q - start)) > 1e-3, 1.0):
            assert time.monotonic() < deadline, "the arm never started"
            self.send(self.joints, points)
        self.spin_sim_seconds(seconds + 1.5)
        return bool(np.max(np.abs(self.q - goal)) < 0.01)

    def spin_sim_seconds(self, seconds: float, timeout: float = 60.0) -> None:
        # Until /clock arrives (it is discovered separately from /joint_states) sim time reads 0.
        assert self.wait(lambda: self.now() > 0.0, timeout), "no /clock"
        assert self.wait_elapsed(seconds, timeout), "sim time stalled"

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
        assert self.jtc is not None, "only a probe made with commands=True sends"
        assert self.wait(lambda: self.jtc.get_subscription_count() > 0, 60), "no driver"
        # The driver obeys a publisher once the graph names its node (node names travel apart
        # from the endpoints): wait until this side names the driver's subscription, and a few
        # of the driver's 20 Hz graph checks more.
        if not self._driver_knows_us:
            assert self.wait(self._driver_named, 60), "the driver's node is not named"
            self.wait(lambda: False, 0.3)  # the driver's graph checks: nothing to observe
            self._driver_knows_us = True
        self.jtc.publish(msg)

    def _driver_named(self) -> bool:
        subscriptions = self.node.get_subscriptions_info_by_topic(self.jtc_topic)
        return bool(subscriptions) and all(
            not info.node_name.startswith("_NODE_NAME_UNKNOWN") for info in subscriptions
        )


class URProbe(Probe):
    """Probe of the simulated UR5e: UR joint names, a JointTrajectoryController of UR's."""

    joints = UR

    def __init__(
        self, domain_id: int, jtc: str = "scaled_joint_trajectory_controller",
        joint_prefix: str = "", commands: bool = False,
    ):  # fmt: skip
        super().__init__(domain_id, jtc, joint_prefix=joint_prefix, commands=commands)
