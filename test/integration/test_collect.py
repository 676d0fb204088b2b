"""Collection through the node stack (task sim driver + sim cameras over real DDS, lock-step)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from vla_runtime.data.collect import collect
from vla_runtime.data.lerobot.reader import load_episode, load_metadata

REPO = Path(__file__).resolve().parents[2]
SIZE = 32  # rendering cost barely depends on size; small keeps videos and DDS traffic light

pytestmark = pytest.mark.integration


def test_lockstep_collection_over_ros_matches_the_in_process_simulation(ros_domain, tmp_path):
    ros = collect("reach", 2, tmp_path / "ros", seed=5, mode="lockstep", image_size=SIZE,
                  progress=False)  # fmt: skip
    local = collect("reach", 2, tmp_path / "local", seed=5, mode="inprocess", image_size=SIZE,
                    progress=False)  # fmt: skip
    assert ros["episodes"] == local["episodes"] == 2
    assert ros["expert_success_rate"] == 1.0
    a, b = load_metadata(tmp_path / "ros"), load_metadata(tmp_path / "local")
    assert [r["seed"] for r in a.episodes] == [5, 6]
    for index in range(2):
        x, y = load_episode(a, index), load_episode(b, index)
        assert x.task == y.task and x.success
        # Lock-step over topics is deterministic: the same trajectories as in process.
        np.testing.assert_allclose(x.state, y.state, atol=1e-6)
        np.testing.assert_allclose(x.action, y.action, atol=1e-6)
        assert x.frame_success[-1] and not x.frame_success[0]
        assert x.images["scene"].shape == (len(x.state), SIZE, SIZE, 3)


def test_interrupted_collection_keeps_its_finished_episodes(ros_domain, tmp_path):
    out = tmp_path / "data"
    log = tmp_path / "collect.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.data.collect", "--task", "reach", "--episodes", "50",
         "--out", str(out), "--image-size", str(SIZE), "--json", "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
        # a shell running the suite in the background hands SIGINT down ignored (SIG_IGN);
        # Ctrl-C must reach the collector as it would from a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while len(list(out.glob("meta/episodes/*/*.parquet"))) < 2:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no episodes committed in time"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        stdout, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, log.read_text()[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["interrupted"] and 2 <= summary["episodes"] < 50
    meta = load_metadata(out)
    assert len(meta.episodes) == summary["episodes"]
    for index in range(len(meta.episodes)):
        episode = load_episode(meta, index)  # every committed episode is complete and verifies
        assert episode.success and len(episode.state) > 10


def test_record_writes_rosbag2_style_mcap(rclpy_context, tmp_path):
    import rclpy
    from mcap.reader import make_reader
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    out = tmp_path / "run"  # a rosbag2 bag directory: run/run_0.mcap and run/metadata.yaml
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    recorder = subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.data.record", "--out", str(out), "--duration", "8",
         "--topics", "/joint_states", "/vla/instruction"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    node = rclpy.create_node("fake_stack", context=rclpy_context)
    try:
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)  # fmt: skip
        node.create_publisher(String, "/vla/instruction", latched).publish(
            String(data="touch the red cube")
        )
        states = node.create_publisher(JointState, "/joint_states", 10)
        k = 0
        while recorder.poll() is None:
            states.publish(JointState(name=["a", "b"], position=[float(k), -float(k)]))
            k += 1
            time.sleep(0.02)
        output = recorder.communicate(timeout=30)[0]
    finally:
        if recorder.poll() is None:
            recorder.kill()
        node.destroy_node()
    assert recorder.returncode == 0, output
    assert (out / "metadata.yaml").is_file()
    with (out / "run_0.mcap").open("rb") as f:
        reader = make_reader(f)
        assert reader.get_header().profile == "ros2"
        messages = list(reader.iter_messages())
    by_topic: dict[str, list] = {}
    for schema, channel, message in messages:
        assert schema.encoding == "ros2msg" and channel.message_encoding == "cdr"
        assert "offered_qos_profiles" in channel.metadata
        by_topic.setdefault(channel.topic, []).append((schema, message))
    schema, message = by_topic["/vla/instruction"][0]
    assert schema.name == "std_msgs/msg/String"
    assert deserialize_message(message.data, String).data == "touch the red cube"
    joint_schema = by_topic["/joint_states"][0][0]
    assert "MSG: std_msgs/Header" in joint_schema.data.decode()
    decoded = [deserialize_message(m.data, JointState) for _, m in by_topic["/joint_states"]]
    assert len(decoded) > 20
    positions = [d.position[0] for d in decoded]
    assert positions == sorted(positions) and decoded[0].position[1] == -positions[0]
