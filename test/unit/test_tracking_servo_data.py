"""Data and evaluations on an arm whose servo tracks its setpoint, as a real arm's controller
does: the in-process simulator and the experts run on it, and datasets and evaluation summaries
say which servo made them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.data.collect import collect
from vla_runtime.data.evaluate import eval_main
from vla_runtime.data.expert_recording import run_expert_episode
from vla_runtime.sim.env import InProcessEnv
from vla_runtime.sim.tasks import SceneReader, scene_colours


def _tracking_error(servo_feedforward: bool) -> tuple[bool, float]:
    """Expert success on one reach episode, and how far (rad, mean over joints and steps) the
    measured arm trails the previous step's command."""
    env = InProcessEnv("reach", 32, servo_feedforward=servo_feedforward)
    try:
        episode, figures = run_expert_episode(
            env, "reach", 3, SceneReader(env.model, scene_colours())
        )
    finally:
        env.close()
    arm = slice(0, 7)
    trail = episode.action[:-1, arm] - episode.state[1:, arm]
    return figures["success"], float(np.abs(trail).mean())


def test_the_expert_solves_reach_on_a_tracking_servo_and_the_arm_trails_it_less():
    lag_success, lagging = _tracking_error(False)
    ff_success, tracking = _tracking_error(True)
    assert lag_success and ff_success
    assert tracking < 0.5 * lagging, (tracking, lagging)


@pytest.mark.usefixtures("torch_one_thread")
def test_a_collection_says_which_servo_made_it(tmp_path):
    summary = collect("reach", 1, tmp_path / "ff", seed=4, mode="inprocess", image_size=32,
                      progress=False, servo_feedforward=True)  # fmt: skip
    assert summary["servo_feedforward"] is True and summary["expert_success_rate"] == 1.0


@pytest.mark.usefixtures("torch_one_thread")
def test_an_in_process_evaluation_runs_on_the_servo_asked_for(capsys):
    argv = ["--ckpt", str(shipped_checkpoint()), "--task", "reach", "--via", "inprocess",
            "--episodes", "1", "--json", "--no-progress"]  # fmt: skip
    assert eval_main([*argv, "--servo-feedforward"]) == 0
    assert json.loads(capsys.readouterr().out)["servo_feedforward"] is True
    assert eval_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["servo_feedforward"] is False
