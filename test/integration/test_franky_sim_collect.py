"""The collector's dry run on the franka direct stack: `vla-runtime collect --real franky_sim:=true
direct:=true`, through two scripted episodes with the terminal view on.

franky-sim (libfranka protocol) stands in for the FR3 among the workcell's cubes; the franky
driver, the safety node, the streamer and the engine running the perception expert are the
franka stack's, and the cameras render franky-sim's scene. The referee reads franky-sim's
cubes to check the labels and the resets."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from rich.console import Console

from vla_runtime.data import perception_collect
from vla_runtime.data.collect_console import CollectConsole
from vla_runtime.data.lerobot.reader import load_episode, load_metadata
from vla_runtime.sim.franky_workcell import FrankyWorkcell
from vla_runtime.sim.tasks import TaskSimulator

pytestmark = pytest.mark.integration


def loopback() -> str:
    """A loopback address no other test's franky-sim serves on."""
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


def test_franky_sims_workcell_is_the_task_scene_in_the_workcell_models_layout():
    workcell = FrankyWorkcell("pick", seed=3, hostname=loopback())
    try:
        for _ in range(300):  # 0.3 s: the cubes settle on the table, the arm holds home
            workcell.step()
        ours = TaskSimulator("pick", 3)
        qpos = workcell.scene_qpos()
        assert qpos.shape == ours.qpos.shape
        assert np.abs(qpos[:9] - ours.qpos[:9]).max() < 2e-3  # arm at home, hand open
        cubes = qpos[9:].reshape(-1, 7)
        assert np.abs(cubes[:, :3] - ours.qpos[9:].reshape(-1, 7)[:, :3]).max() < 1e-3
    finally:
        workcell.close()


def test_two_episodes_are_collected_on_franky_sim_with_the_terminal_view(
    ros_domain, tmp_path, monkeypatch
):
    screen = io.StringIO()

    def console(*args, **kwargs):
        view = Console(file=screen, force_terminal=True, width=120)
        return CollectConsole(*args, **{**kwargs, "console": view})

    monkeypatch.setattr(perception_collect, "CollectConsole", console)
    out = tmp_path / "data"
    real = {"franky_sim": True, "direct": True, "franky_sim_ip": loopback()}
    summary = perception_collect.collect_with_perception(
        "reach", 2, out, seed=5, progress=True, keys=io.StringIO(""), real=real
    )
    assert not summary["interrupted"], summary.get("error")
    assert summary["episodes"] == 2 and summary["dataset_episodes"] == 2
    assert summary["resets"]["ok"] >= 2
    # Labels from the cameras, the referee's verdict from franky-sim's physics.
    assert summary["label_agreement"] == 1.0
    assert summary["localisation_error_m"]["p95"] <= 0.01
    shown = screen.getvalue()
    assert "franka stack" in shown and "2/2" in shown
    meta = load_metadata(out)
    episode = load_episode(meta, 1)
    assert episode.images["scene"].shape[1:] == (96, 96, 3)  # scaled from the 224 px camera
    assert np.isfinite(episode.action).all() and len(episode.state) >= 20
