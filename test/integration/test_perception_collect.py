"""Perception collection through the product stack (sim driver, cameras, engine running the
perception expert, safety node, streamer) in real time, with the simulator's state poisoned for
the collector: whatever it took from /sim/* would be scrambled."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from std_msgs.msg import Float64MultiArray

from vla_runtime.data.collect import collect_main
from vla_runtime.data.lerobot.reader import load_episode, load_metadata
from vla_runtime.data.perception_collect import CollectorNode, collect_with_perception
from vla_runtime.ros.node import RuntimeNode

pytestmark = pytest.mark.integration


def poison_the_simulator_for_the_collector(monkeypatch) -> list[str]:
    """Every /sim/* subscription of the collector's node gets scrambled messages; returns the
    topics it subscribed to."""
    taken: list[str] = []
    subscribe = RuntimeNode.create_subscription
    rng = np.random.default_rng(0)

    def guarded(self, msg_type, topic, callback, *args, **kwargs):
        if self.get_name() == CollectorNode.NAME and topic.startswith("/sim/"):
            taken.append(topic)

            def scrambled(msg):
                if isinstance(msg, Float64MultiArray):
                    msg.data = rng.uniform(-1.0, 1.0, len(msg.data)).tolist()
                callback(msg)

            return subscribe(self, msg_type, topic, scrambled, *args, **kwargs)
        return subscribe(self, msg_type, topic, callback, *args, **kwargs)

    monkeypatch.setattr(RuntimeNode, "create_subscription", guarded)
    return taken


def test_a_reach_episode_is_collected_reset_and_labelled_from_the_cameras(
    ros_domain, tmp_path, monkeypatch
):
    taken = poison_the_simulator_for_the_collector(monkeypatch)
    out = tmp_path / "data"
    # The episode starts from a random hand pose: the reset's last move goes through the stack.
    summary = collect_with_perception("reach", 1, out, seed=3, progress=False, random_starts=1.0)
    assert taken == []
    assert not summary["interrupted"], summary.get("error")
    assert summary["random_starts"] == 1, summary["resets"]
    assert summary["episodes"] == 1 and summary["dataset_episodes"] == 1
    assert summary["resets"]["ok"] >= 1
    assert summary["localisation_error_m"]["n"] == 3
    assert summary["localisation_error_m"]["p95"] <= 0.01
    # The label comes from the cameras, the referee's verdict from the physics: they agree.
    assert summary["label_agreement"] == 1.0
    assert summary["episodes_per_hour"] > 0
    meta = load_metadata(out)
    episode = load_episode(meta, 0)
    assert episode.task.startswith("touch the ")
    assert episode.images["scene"].shape[1:] == (96, 96, 3)
    assert len(episode.state) >= 20 and np.isfinite(episode.action).all()
    # Actions are the commands sent one control period after each frame: they lead the state.
    assert np.abs(episode.action[:, :7] - episode.state[:, :7]).max() > 0.001
    extra = json.loads(meta.episodes[0]["extra"])
    assert extra["label_source"] == "perception" and extra["label_confidence"] > 0.5
    assert len(extra["start_pose"]) == 4  # x, y, z, yaw


def test_bad_perception_arguments_get_one_line_each(tmp_path):
    for arguments, expected in [
        (["--task", "dynamic_reach"], "--perception collects reach, push, pick"),
        (["--task", "reach", "--calibration-dir", str(tmp_path)], "is not calibrated"),
        (["--task", "reach", "--real"], "camera 'scene' is not calibrated"),
        (["--task", "reach", "--real", "franky_sim:=true"], "add direct:=true"),
        (["--task", "reach", "--real", "franky_sim"], "NAME:=VALUE"),
        (["--task", "reach", "--real", "--sim"], "choose one"),
        (["--task", "reach", "seed:=3"], "are for --real"),
        (["--task", "reach", "--random-starts", "1.5"], "is a fraction of episodes, not 1.5"),
    ]:
        run = subprocess.run(
            [sys.executable, "-m", "vla_runtime.data.collect", "--perception", "--episodes",
             "1", "--out", str(tmp_path / "d"), *arguments],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 2, run.stderr
        assert expected in run.stderr
        assert "Traceback" not in run.stderr


def test_random_starts_are_refused_without_perception(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        collect_main(["--task", "reach", "--episodes", "1", "--out", str(tmp_path / "d"),
                      "--mode", "inprocess", "--random-starts", "0.5"])  # fmt: skip
    assert stopped.value.code == 2
    assert "--random-starts is for --perception" in capsys.readouterr().err
