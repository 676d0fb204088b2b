"""Issue 3 acceptance: sim + cameras + engine node (separate processes, real DDS) publish valid
action chunks at the engine's rate, stamped with the capture time of the newest image used."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from stack_probe import Probe, finish, start_launcher
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.integration


def stamp(msg) -> tuple[int, int]:
    return msg.header.stamp.sec, msg.header.stamp.nanosec


def test_engine_publishes_chunks_from_sim_cameras(tmp_path):
    report_path = tmp_path / "run.json"
    proc, domain = start_launcher("policy:=true", "--duration", "12", "--report", str(report_path))
    probe = Probe(domain)
    try:
        chunks = probe.collect(JointTrajectory, "/vla/action_chunk")
        images = {
            cam: probe.collect(Image, f"/vla/cameras/{cam}/image_raw", qos_profile_sensor_data)
            for cam in ("scene", "wrist")
        }
        assert probe.spin_until(lambda: len(chunks) >= 5, 120), "no chunks from the engine"
    finally:
        probe.close()
        code, out = finish(proc, timeout=180)
    assert code == 0, out
    image_stamps = {stamp(m) for msgs in images.values() for m in msgs}
    arm = [f"fr3_joint{i}" for i in range(1, 8)]
    for chunk in chunks:
        assert chunk.joint_names == [*arm, "fr3_finger_joint1"]
        assert len(chunk.points) == 16
        positions = np.array([p.positions for p in chunk.points])
        assert positions.shape == (16, 8) and np.all(np.isfinite(positions))
        times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in chunk.points]
        assert np.all(np.diff(times) > 0)
    # Stamped with a real capture time (the probe may have missed a best-effort frame or two).
    assert sum(stamp(c) in image_stamps for c in chunks) >= len(chunks) - 2
    report = json.loads(report_path.read_text())
    chunk_rate = report["topics"]["/vla/action_chunk"]["rate_hz"]
    stats_rate = report["topics"]["/vla/engine/stats"]["rate_hz"]
    assert chunk_rate > 1.0
    assert chunk_rate == pytest.approx(stats_rate, rel=0.2)  # one stats entry per chunk
    assert report["nodes"]["engine"]["clean"]
