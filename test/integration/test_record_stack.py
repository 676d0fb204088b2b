"""`vla-runtime record --stack` joins a stack started by `vla-runtime launch` on its private
domain and writes a rosbag2 bag directory that the `rosbags` library reads: the stack's topics
with their publishers' QoS (latched ones transient local, with the messages published before
the recorder joined), complete after a --duration or a SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rclpy.qos import qos_profile_sensor_data
from rosbags.interfaces import QosDurability, QosReliability
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore
from stack_probe import Probe, finish, start_launcher

pytestmark = pytest.mark.integration

TYPESTORE = get_typestore(Stores.ROS2_JAZZY)
CAMERAS = ("/vla/cameras/scene/image_raw", "/vla/cameras/wrist/image_raw")
LATCHED = ("/vla/episode", "/vla/instruction")


class Recording:
    """`vla-runtime record ARGS` in a subprocess; its stderr lines collected as they come."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vla_runtime.cli", "record", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def recording(self, topic: str) -> bool:
        return any(line.startswith(f"record: recording {topic} ") for line in self.lines)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        try:
            out, _ = self.process.communicate(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        return self.process.returncode, out, "\n".join(self.lines)


def read_bag(path: Path) -> dict:
    """topic -> (connection, messages deserialised)."""
    with Reader(path) as reader:
        topics = {c.topic: (c, []) for c in reader.connections}
        for connection, _, raw in reader.messages():
            message = TYPESTORE.deserialize_cdr(raw, connection.msgtype)
            topics[connection.topic][1].append(message)
    return topics


def test_record_joins_the_launched_stack_and_writes_a_rosbag2_bag(tmp_path, monkeypatch):
    from sensor_msgs.msg import Image

    # This test's stacks only: `--stack` without a name must find exactly the one started here.
    monkeypatch.setenv("VLA_RUNTIME_RUN_DIR", str(tmp_path / "run"))
    launcher, domain = start_launcher("image_size:=64")
    probe = None
    try:
        [run_file] = (tmp_path / "run").glob("sim-*.json")  # written before the domain line
        assert json.loads(run_file.read_text())["domain_id"] == domain
        probe = Probe(domain)
        frames = {c: probe.record(Image, c, qos_profile_sensor_data) for c in CAMERAS}
        assert probe.wait(lambda: probe.q is not None and all(frames.values()), 120), (
            "the stack published no joint states or frames"
        )

        bag = tmp_path / "bag"
        timed = Recording("--stack", "--duration", "6", "--json", str(bag))
        code, out, err = timed.finish(timeout=120)
        assert code == 0, err
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["stopped_by"] == "duration" and summary["source"].startswith("stack sim-")

        # Stopped by SIGTERM once it has recorded: the bag is as complete as after a duration.
        stopped = tmp_path / "stopped"
        signalled = Recording("--stack", "sim", str(stopped), "--topics", "/joint_states",
                              *LATCHED)  # fmt: skip
        assert probe.wait(lambda: signalled.recording("/joint_states"), 60), signalled.lines
        probe.spin_sim_seconds(1.0)  # joint states published after the recorder subscribed
        signalled.process.send_signal(signal.SIGTERM)
        code, out, err = signalled.finish(timeout=60)
        assert code == 0, err
        assert "record: 3 topics" in out and "stopped by signal" in out, out
    finally:
        if probe is not None:
            probe.close()
        launcher.send_signal(signal.SIGINT)
        finish(launcher, timeout=120)
    assert not run_file.exists()  # removed when the launcher stopped

    assert sorted(p.name for p in bag.iterdir()) == ["bag_0.mcap", "metadata.yaml"]
    topics = read_bag(bag)
    for topic in ("/clock", "/joint_states", *CAMERAS, *LATCHED):
        connection, messages = topics[topic]
        assert messages and connection.msgcount == len(messages), topic
    joint_state = topics["/joint_states"][1][-1]
    assert "fr3_joint1" in list(joint_state.name) and len(joint_state.position) >= 7
    image = topics[CAMERAS[0]][1][-1]
    assert (image.width, image.height) == (64, 64) and len(image.data) == 64 * 64 * 3
    episode = json.loads(topics["/vla/episode"][1][0].data)
    assert episode["task"] == "reach"
    # The publishers' QoS: latched topics transient local, camera frames best effort.
    for topic in LATCHED:
        [offered] = topics[topic][0].ext.offered_qos_profiles
        assert offered.durability == QosDurability.TRANSIENT_LOCAL
        assert offered.reliability == QosReliability.RELIABLE
    [offered] = topics[CAMERAS[0]][0].ext.offered_qos_profiles
    assert offered.reliability == QosReliability.BEST_EFFORT
    assert offered.durability == QosDurability.VOLATILE

    stopped_topics = read_bag(stopped)
    assert sorted(stopped_topics) == sorted(["/joint_states", *LATCHED])
    assert stopped_topics["/joint_states"][1]
    for topic, (connection, messages) in stopped_topics.items():
        assert connection.msgcount == len(messages), topic  # metadata and MCAP agree
