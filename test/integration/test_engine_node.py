"""Engine node: pure helpers, then the real node (separate process) over real DDS."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sensor_msgs.msg import Image
from std_msgs.msg import String

from vla_runtime.engine.policy import ActionSpace
from vla_runtime.engine.rtc import plan_prefix
from vla_runtime.engine.state_mapping import StateMapping, SyncError
from vla_runtime.ros.messages import image_from_msg, to_seconds

REPO = Path(__file__).resolve().parents[2]
ARM = tuple(f"fr3_joint{i}" for i in range(1, 8))
FINGERS = ("fr3_finger_joint1", "fr3_finger_joint2")

# ------------------------------------------------------------------------------ pure helpers


def test_state_mapping_sums_finger_joints_in_declared_order():
    mapping = StateMapping(ARM, FINGERS, "sum")
    names = ["fr3_finger_joint2", *reversed(ARM), "fr3_finger_joint1", "other"]
    positions = [0.03, *range(7, 0, -1), 0.01, 99.0]  # joint k has position k
    np.testing.assert_allclose(mapping.state_from(names, positions), [1, 2, 3, 4, 5, 6, 7, 0.04])
    assert mapping.joint_names == [*ARM, "fr3_finger_joint1"]
    assert StateMapping(ARM, FINGERS, "sum", "hand").joint_names == [*ARM, "hand"]
    mean = StateMapping(ARM, FINGERS, "mean")
    assert mean.state_from(names, positions)[-1] == pytest.approx(0.02)
    assert StateMapping(ARM, (), "none").state_dim == 7
    with pytest.raises(SyncError, match="fr3_joint3"):
        mapping.state_from([n for n in names if n != "fr3_joint3"], positions[:-1])
    with pytest.raises(SyncError, match="not finite"):
        mapping.state_from(names, [float("nan"), *positions[1:]])
    with pytest.raises(ValueError, match="gripper_joints"):
        StateMapping(ARM, (), "sum")


def test_joint_deltas_are_relative_to_the_observed_state_and_gripper_absolute():
    from dataclasses import replace

    from vla_runtime.engine.model import default_spec

    mapping = StateMapping(ARM, FINGERS, "sum")
    deltas_spec = default_spec(action_space=ActionSpace.JOINT_DELTAS)
    state = np.arange(8, dtype=np.float32)
    deltas = np.full((3, 8), 0.5, dtype=np.float32)
    positions = mapping.to_positions(deltas, state, deltas_spec)
    np.testing.assert_allclose(positions[:, :7], np.tile(state[:7] + 0.5, (3, 1)))
    np.testing.assert_allclose(positions[:, 7], [0.25] * 3)  # width 0.5 -> 0.25 per finger
    back = mapping.to_actions(positions, state, deltas_spec)
    np.testing.assert_allclose(back, deltas)
    absolute = replace(deltas_spec, action_space=ActionSpace.JOINT_POSITIONS)
    same = mapping.to_positions(deltas, state, absolute)
    np.testing.assert_allclose(same[:, :7], deltas[:, :7])
    np.testing.assert_allclose(mapping.to_actions(same, state, absolute), deltas)


def test_image_from_msg_handles_padding_and_bgr():
    rgb = np.arange(4 * 3 * 3, dtype=np.uint8).reshape(4, 3, 3)
    padded = np.zeros((4, 12), dtype=np.uint8)
    padded[:, :9] = rgb.reshape(4, 9)
    msg = Image(height=4, width=3, encoding="rgb8", step=12, data=padded.tobytes())
    np.testing.assert_array_equal(image_from_msg(msg), rgb)
    msg.encoding = "bgr8"
    np.testing.assert_array_equal(image_from_msg(msg), rgb[:, :, ::-1])
    msg.encoding = "mono8"
    with pytest.raises(ValueError, match="encoding"):
        image_from_msg(msg)
    short = Image(height=4, width=3, encoding="rgb8", step=9, data=bytes(10))
    with pytest.raises(ValueError, match="too short"):
        image_from_msg(short)


def test_plan_prefix_resamples_the_plan_on_the_new_chunk_grid():
    times = np.array([10.0, 10.1, 10.2, 10.3])
    positions = np.stack([times * 10, -times], axis=1)
    # Capture at 10.0, dt 0.05, expected delay 0.16 s -> actions at 10.05, 10.10, 10.15.
    prefix = plan_prefix(times, positions, t_obs=10.0, dt=0.05, horizon_s=0.16)
    np.testing.assert_allclose(prefix[:, 0], [100.5, 101.0, 101.5])
    np.testing.assert_allclose(prefix[:, 1], [-10.05, -10.1, -10.15])
    # The plan ends before the horizon: only the covered steps.
    assert len(plan_prefix(times, positions, t_obs=10.2, dt=0.05, horizon_s=1.0)) == 2
    # Plan starts after the first action time: no guidance (it must cover action 0).
    assert plan_prefix(times, positions, t_obs=9.0, dt=0.05, horizon_s=2.0) is None
    assert plan_prefix(times, positions, t_obs=10.0, dt=0.05, horizon_s=0.0) is None


# ------------------------------------------------------------------------------ real node

SIZE = 224


def _start_engine(tmp_path: Path, name: str, *params: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / f"{name}.log"
    args = [sys.executable, "-m", "vla_runtime.nodes.engine", "--ros-args"]
    for param in (
        "max_image_age_s:=5.0",
        "max_state_age_s:=5.0",
        "instruction:=pick up the red cube",
        *params,
    ):
        args += ["-p", param]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    return process, log


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class RobotSide:
    """Publishes what cameras and the arm driver would; records what the engine publishes."""

    def __init__(self, ctx, cameras=("scene", "wrist")):
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import (
            DurabilityPolicy,
            QoSProfile,
            ReliabilityPolicy,
            qos_profile_sensor_data,
        )
        from sensor_msgs.msg import JointState
        from trajectory_msgs.msg import JointTrajectory

        from vla_runtime.core import topics

        self.node = rclpy.create_node("robot_side", context=ctx)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        self.cameras = list(cameras)
        self.image_pubs = {
            cam: self.node.create_publisher(
                Image, topics.camera_image(cam), qos_profile_sensor_data
            )
            for cam in ("scene", "wrist")
        }
        self.state_pub = self.node.create_publisher(JointState, topics.JOINT_STATES, 10)
        self.request_pub = self.node.create_publisher(JointTrajectory, topics.INFERENCE_REQUEST, 10)
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self.instruction_pub = self.node.create_publisher(String, topics.INSTRUCTION, latched)
        self.mode_pub = self.node.create_publisher(String, topics.COMPUTE_MODE, 10)
        self.instruction_pub.publish(String(data="pick up the red cube"))
        self.chunks: list = []
        self.stats: list = []
        self.node.create_subscription(JointTrajectory, topics.ACTION_CHUNK, self.chunks.append, 10)
        self.node.create_subscription(DiagnosticArray, topics.ENGINE_STATS, self.stats.append, 10)
        self.image_stamps: set[tuple[int, int]] = set()
        self._rng = np.random.default_rng(0)
        self._frame = self._rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8).tobytes()
        self.node.create_timer(0.1, self._publish_images)
        self.node.create_timer(0.02, self._publish_state)
        self._JointState = JointState
        self._JointTrajectory = JointTrajectory

    def _publish_images(self) -> None:
        stamp = self.node.get_clock().now().to_msg()
        for cam in self.cameras:
            msg = Image(height=SIZE, width=SIZE, encoding="rgb8", step=SIZE * 3, data=self._frame)
            msg.header.stamp = stamp
            self.image_pubs[cam].publish(msg)
        self.image_stamps.add((stamp.sec, stamp.nanosec))

    def _publish_state(self) -> None:
        msg = self._JointState(name=[*ARM, *FINGERS], position=[0.1] * 7 + [0.02, 0.02])
        msg.header.stamp = self.node.get_clock().now().to_msg()
        self.state_pub.publish(msg)

    def request(self, request_id: str = "") -> None:
        msg = self._JointTrajectory()
        msg.header.frame_id = request_id
        self.request_pub.publish(msg)

    def spin_until(self, condition, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.executor.spin_once(timeout_sec=0.05)
            if condition():
                return True
        return False

    def error_stats(self, text: str) -> list:
        return [
            status
            for array in self.stats
            for status in array.status
            if status.level == status.ERROR and text in status.message
        ]

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


def _load_tiny_spec():
    from vla_runtime.engine.factory import load_policy

    return load_policy(backend="torch", preset="tiny", device="cpu", seed=0).spec


def _check_chunk(chunk, spec, image_stamps) -> None:
    assert (chunk.header.stamp.sec, chunk.header.stamp.nanosec) in image_stamps
    assert chunk.joint_names == [*ARM, "fr3_finger_joint1"]
    assert len(chunk.points) == spec.chunk_len
    for k, point in enumerate(chunk.points):
        assert len(point.positions) == spec.action_dim
        assert np.all(np.isfinite(point.positions))
        t = to_seconds(point.time_from_start)
        assert t == pytest.approx((k + 1) * spec.dt, abs=1e-6)


@pytest.mark.integration
def test_engine_publishes_valid_chunks_from_synthetic_cameras(rclpy_context, tmp_path):
    spec = _load_tiny_spec()
    process, log = _start_engine(tmp_path, "engine", "run_mode:=continuous")
    robot = RobotSide(rclpy_context)
    try:
        assert robot.spin_until(lambda: len(robot.chunks) >= 3, 120), log.read_text()
        for chunk in robot.chunks:
            _check_chunk(chunk, spec, robot.image_stamps)
        ok = [s for a in robot.stats for s in a.status if s.level == s.OK]
        assert ok, "no stats published with the chunks"
        values = {kv.key: kv.value for kv in ok[-1].values}
        assert values["mode"] == "v0d0" and float(values["latency_ms"]) > 0
        assert {"vision_ms", "backbone_ms", "action_head_ms"} <= set(values)

        # The scheduler switches to instruction-KV reuse; a malformed mode is only logged.
        robot.mode_pub.publish(String(data="fast please"))
        robot.mode_pub.publish(String(data="v1d1"))

        def reuse_mode_reported():
            return any(
                kv.key == "mode" and kv.value == "v1d1"
                for array in robot.stats
                for status in array.status
                for kv in status.values
            )

        assert robot.spin_until(reuse_mode_reported, 60), log.read_text()
        assert "compute mode rejected" in log.read_text()
        assert process.poll() is None
    finally:
        robot.close()
        _stop(process)


@pytest.mark.integration
def test_missing_camera_is_an_error_then_recovers(rclpy_context, tmp_path):
    spec = _load_tiny_spec()
    process, log = _start_engine(tmp_path, "engine", "run_mode:=on_request")
    robot = RobotSide(rclpy_context, cameras=("scene",))
    try:
        # Request until the engine reports the missing wrist camera; no chunk meanwhile.
        def wrist_error_reported():
            robot.request()
            return bool(robot.error_stats("wrist"))

        assert robot.spin_until(wrist_error_reported, 120), log.read_text()
        robot.spin_until(lambda: False, 1.0)
        assert robot.chunks == []
        assert process.poll() is None
        robot.cameras.append("wrist")
        robot.request("req:42")
        assert robot.spin_until(lambda: robot.chunks, 60), log.read_text()
        _check_chunk(robot.chunks[-1], spec, robot.image_stamps)
        assert robot.chunks[-1].header.frame_id == "req:42"  # the streamer's delay bookkeeping
        assert "no image yet from camera(s) ['wrist']" in log.read_text()
    finally:
        robot.close()
        _stop(process)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(endpoint: str, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.engine.remote.serve_cli", "--backend", "torch"]
        + ["--preset", "tiny", "--bind", endpoint],
        cwd=REPO,
        env=env,
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
    )


@pytest.mark.integration
def test_remote_server_restart_recovers_without_restarting_the_node(rclpy_context, tmp_path):
    spec = _load_tiny_spec()
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    server = _start_server(endpoint, tmp_path / "server.log")
    process, log = _start_engine(
        tmp_path,
        "engine",
        "run_mode:=continuous",
        "backend:=remote",
        f"endpoint:={endpoint}",
        "remote_timeout_s:=1.0",
    )
    robot = RobotSide(rclpy_context)
    try:
        assert robot.spin_until(lambda: len(robot.chunks) >= 2, 120), log.read_text()
        server.kill()
        server.wait()
        assert robot.spin_until(lambda: robot.error_stats("RemoteUnavailable"), 60), log.read_text()
        assert process.poll() is None
        before = len(robot.chunks)
        server = _start_server(endpoint, tmp_path / "server.log")
        assert robot.spin_until(lambda: len(robot.chunks) >= before + 2, 120), log.read_text()
        _check_chunk(robot.chunks[-1], spec, robot.image_stamps)
        assert process.poll() is None
    finally:
        robot.close()
        _stop(process)
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.integration
def test_a_request_sent_before_the_engine_hears_of_the_episode_is_still_served(
    rclpy_context, tmp_path
):
    """The streamer may hear of a new episode first and ask for its first chunk before the
    engine gets the episode message: the engine keeps that request (it drops only requests
    stamped before the episode began) and serves it once frames of the episode arrive."""
    from trajectory_msgs.msg import JointTrajectory

    from vla_runtime.core import topics
    from vla_runtime.ros.qos import LATCHED

    process, log = _start_engine(tmp_path, "engine")  # on_request
    robot = RobotSide(rclpy_context, cameras=())  # no frames yet: the request must wait
    episode_pub = robot.node.create_publisher(String, topics.EPISODE, LATCHED)
    try:
        assert robot.spin_until(lambda: robot.request_pub.get_subscription_count() > 0, 60)
        now = robot.node.get_clock().now()
        request = JointTrajectory()
        request.header.stamp = now.to_msg()
        request.header.frame_id = "req:7"
        robot.request_pub.publish(request)
        assert robot.spin_until(lambda: robot.error_stats("no image yet"), 120), log.read_text()
        start = now.nanoseconds * 1e-9 - 0.5  # the episode began just before the request
        episode_pub.publish(String(data=json.dumps({"episode": 2, "stamp": start})))
        assert robot.spin_until(lambda: episode_pub.get_subscription_count() > 0, 30)
        robot.cameras = ["scene", "wrist"]  # frames of the new episode
        served = robot.spin_until(
            lambda: any(c.header.frame_id == "req:7" for c in robot.chunks), 120
        )
        assert served, log.read_text()
    finally:
        robot.close()
        _stop(process)
