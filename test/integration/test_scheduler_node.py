"""The scheduler node as its own process over real DDS: the test plays the arm (joint states),
the cameras, the engine (stats reporting the mode it was told to run), the safety node and the
instruction publisher, and checks the compute mode chosen for each inference."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from vla_runtime.core import topics
from vla_runtime.core.robot import load_robot
from vla_runtime.core.scheduler import SchedulerConfig

pytestmark = pytest.mark.integration

ROBOT = load_robot("fr3")
FINGER = ROBOT.gripper_joints[0]
SPEED = 0.3  # rad/s on every arm joint: free-space transport
CONFIG = SchedulerConfig(refresh_every=4, hold_inferences=1, start_full_s=0.0)


class Harness:
    def __init__(self, context):
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import (
            DurabilityPolicy,
            QoSProfile,
            ReliabilityPolicy,
            qos_profile_sensor_data,
        )
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import String
        from trajectory_msgs.msg import JointTrajectory

        self.node = rclpy.create_node("scheduler_harness", context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        node = self.node
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self.state_pub = node.create_publisher(JointState, topics.JOINT_STATES, 10)
        self.image_pubs = {
            cam: node.create_publisher(Image, topics.camera_image(cam), qos_profile_sensor_data)
            for cam in ("scene", "wrist")
        }
        self.stats_pub = node.create_publisher(DiagnosticArray, topics.ENGINE_STATS, 10)
        self.safety_pub = node.create_publisher(String, topics.SAFETY_EVENTS, 10)
        self.chunk_pub = node.create_publisher(JointTrajectory, topics.ACTION_CHUNK, 10)
        instruction = node.create_publisher(String, topics.INSTRUCTION, latched)
        instruction.publish(String(data="pick up the red cube"))
        self.modes: list[dict] = []
        self.signals: list[dict] = []
        node.create_subscription(
            String, topics.COMPUTE_MODE, lambda m: self.modes.append(json.loads(m.data)), 10
        )
        node.create_subscription(
            DiagnosticArray,
            "/vla/scheduler/signals",
            lambda a: self.signals.extend({kv.key: kv.value for kv in s.values} for s in a.status),
            50,
        )
        rng = np.random.default_rng(0)
        self.frame = rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)
        self.t0 = time.monotonic()
        self.chunks = 0
        self._JointState, self._Image, self._String = JointState, Image, String
        self._DiagnosticArray, self._JointTrajectory = DiagnosticArray, JointTrajectory
        node.create_timer(0.01, self._publish_state)
        node.create_timer(0.1, self._publish_images)

    def _publish_state(self) -> None:
        t = time.monotonic() - self.t0
        msg = self._JointState(
            name=[*ROBOT.joints, FINGER], position=[SPEED * t] * ROBOT.dof + [0.04]
        )
        msg.header.stamp = self.node.get_clock().now().to_msg()
        self.state_pub.publish(msg)

    def _publish_images(self) -> None:
        for pub in self.image_pubs.values():  # a still scene
            msg = self._Image(height=96, width=96, encoding="rgb8", step=96 * 3)
            msg.data = self.frame.tobytes()
            msg.header.stamp = self.node.get_clock().now().to_msg()
            pub.publish(msg)

    def spin_until(self, condition, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.executor.spin_once(timeout_sec=0.02)
            if condition():
                return True
        return False

    def infer(self) -> str:
        """Run the mode the scheduler asks for now; return it once the scheduler has seen the
        report (its signals count the inference)."""
        from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

        self.spin_until(lambda: False, 0.15)  # let the arm move between inferences
        token = self.signals[-1]["mode"]
        self.chunks += 1
        values = {"mode": token, "chunk_divergence": "0.05", "vision_similarity_scene": "0.99"}
        status = DiagnosticStatus(
            level=DiagnosticStatus.OK,
            name="engine",
            message=f"chunk {self.chunks}",
            values=[KeyValue(key=k, value=v) for k, v in values.items()],
        )
        self.stats_pub.publish(self._DiagnosticArray(status=[status]))
        n = self.chunks
        assert self.spin_until(
            lambda: self.signals and self.signals[-1]["inferences"] == str(n), 10
        ), "the scheduler did not take the engine report"
        return token

    def veto(self) -> None:
        event = {"source": "chunk_check", "event": "chunk", "verdict": "veto", "reasons": ["x"]}
        self.safety_pub.publish(self._String(data=json.dumps(event)))

    def plan_gripper_close(self) -> None:
        from builtin_interfaces.msg import Duration
        from trajectory_msgs.msg import JointTrajectoryPoint

        msg = self._JointTrajectory(joint_names=[*ROBOT.joints, FINGER])
        msg.header.stamp = self.node.get_clock().now().to_msg()
        for k in range(16):
            opening = 0.04 if k < 3 else 0.0
            ns = (k + 1) * 50_000_000
            msg.points.append(
                JointTrajectoryPoint(
                    positions=[0.0] * ROBOT.dof + [opening],
                    time_from_start=Duration(sec=ns // 10**9, nanosec=ns % 10**9),
                )
            )
        self.chunk_pub.publish(msg)

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


def test_scheduler_node_decides_per_inference(rclpy_context, tmp_path):
    config = tmp_path / "scheduler.yaml"
    config.write_text(CONFIG.to_yaml())
    log = tmp_path / "scheduler.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.nodes.scheduler", "--ros-args"]
        + ["-p", f"config:={config}"],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
    )
    harness = Harness(rclpy_context)
    try:
        # the first decision (before any inference) is a full refresh
        assert harness.spin_until(lambda: harness.modes, 60), log.read_text()
        assert harness.modes[0] == {"vision_level": 1, "denoise_level": 0}
        # wait until it has measured the arm moving and seen both cameras
        assert harness.spin_until(
            lambda: harness.signals and "joint_speed" in harness.signals[-1], 30
        ), log.read_text()
        ran = [harness.infer() for _ in range(6)]
        # transport: all cameras reused, state fresh; a full refresh every 4 inferences
        assert ran == ["v1d0", "v3d2", "v3d2", "v3d2", "v1d0", "v3d2"], harness.signals[-6:]
        last = harness.signals[-1]
        assert float(last["joint_speed"]) == pytest.approx(SPEED, rel=0.2)
        assert float(last["image_change_scene"]) == 0.0
        assert float(last["dissimilarity_scene"]) == pytest.approx(0.01)
        assert float(last["tcp_speed"]) > 0

        harness.veto()  # a safety veto: the next inference is full, then reuse again
        assert harness.spin_until(lambda: harness.signals[-1]["mode"] == "v1d0", 10)
        assert "safety" in harness.signals[-1]["reasons"]
        assert [harness.infer(), harness.infer()] == ["v1d0", "v3d2"]

        harness.plan_gripper_close()  # the newest chunk closes the gripper soon: full
        assert harness.spin_until(lambda: harness.signals[-1]["mode"] == "v1d0", 10)
        assert "gripper" in harness.signals[-1]["reasons"]
        assert harness.infer() == "v1d0"
        assert process.poll() is None, log.read_text()
    finally:
        harness.close()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
