"""The data path on another arm: the UR5e's scripted experts solve the tasks, its datasets
and checkpoints say which arm they are for, and an FR3 policy's weights seed a UR5e one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.data.ab import ab_main
from vla_runtime.data.collect import collect, collect_main
from vla_runtime.data.evaluate import eval_main
from vla_runtime.data.expert_recording import run_expert_episode, task_dataset_writer
from vla_runtime.data.lerobot.reader import load_metadata
from vla_runtime.data.lerobot.writer import DatasetError
from vla_runtime.data.train import train
from vla_runtime.engine.checkpoint import load_checkpoint, random_checkpoint, save_checkpoint
from vla_runtime.engine.model import default_spec
from vla_runtime.sim.env import InProcessEnv
from vla_runtime.sim.tasks import TASKS, SceneReader, scene_colours

pytestmark = pytest.mark.usefixtures("torch_one_thread")
UR5E_JOINTS = ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint",
               "wrist_2_joint", "wrist_3_joint"]  # fmt: skip


@pytest.fixture(scope="module")
def ur5e_reach(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "reach"
    summary = collect("reach", 2, out, seed=7, mode="inprocess", image_size=32,
                      progress=False, robot="ur5e")  # fmt: skip
    return out, summary


def test_the_ur5e_experts_solve_every_task():
    for task in TASKS:
        env = InProcessEnv(task, 32, robot="ur5e")
        try:
            reader = SceneReader(env.model, scene_colours())
            episode, figures = run_expert_episode(env, task, 11, reader)
        finally:
            env.close()
        assert figures["success"], task
        assert episode.state.shape[1] == 7 and episode.action.shape[1] == 7


def test_a_ur5e_dataset_names_its_arm_and_takes_no_other(ur5e_reach, tmp_path):
    out, summary = ur5e_reach
    assert summary["robot"] == "ur5e" and summary["expert_success_rate"] == 1.0
    info = load_metadata(out).info
    assert info["robot_type"] == "ur5e"
    assert info["features"]["observation.state"]["names"] == [*UR5E_JOINTS, "gripper_width"]
    with pytest.raises(DatasetError, match="holds ur5e episodes; cannot append fr3"):
        task_dataset_writer(out, 32, "fr3")


def test_collect_refuses_an_arm_without_a_simulator(capsys):
    with pytest.raises(SystemExit):
        collect_main(["--robot", "panda", "--task", "reach", "--episodes", "1", "--out", "x"])
    assert "invalid choice: 'panda'" in capsys.readouterr().err


def test_recovery_refuses_an_arm_other_than_the_policys(capsys):
    fr3_policy = str(shipped_checkpoint())
    with pytest.raises(SystemExit):
        collect_main(["--robot", "ur5e", "--recover-from", fr3_policy, "--task", "reach",
                      "--episodes", "1", "--out", "x"])  # fmt: skip
    assert f"--recover-from {fr3_policy} was trained for fr3, not ur5e" in capsys.readouterr().err


def test_a_ur5e_policy_is_trained_for_the_ur5e_from_an_fr3_policys_weights(ur5e_reach, tmp_path):
    data, _ = ur5e_reach
    fr3 = random_checkpoint(spec=default_spec(image_size=32, action_space="joint_deltas"))
    save_checkpoint(tmp_path / "fr3", fr3)
    summary = train([str(data)], tmp_path / "ur5e", steps=1, batch_size=2, save_every=1,
                    progress=False, action_space="joint_deltas", init=tmp_path / "fr3",
                    lr=0.0)  # fmt: skip
    ur5e = load_checkpoint(tmp_path / "ur5e")
    spec = json.loads((tmp_path / "ur5e" / "spec.json").read_text())["spec"]
    assert spec["robot"] == "ur5e" and spec["state_dim"] == 7
    assert spec["joint_names"] == [*UR5E_JOINTS, "gripper_finger_joint1"]
    before, after = fr3.model.state_dict(), ur5e.model.state_dict()
    same = [k for k in after if before[k].shape == after[k].shape]
    fresh = [k for k in after if before[k].shape != after[k].shape]
    assert fresh and len(same) > 10 * len(fresh)  # only the state and action layers start anew
    carried = f"{len(same)} of {len(after)} tensors carried over"
    assert summary["init_from_another_arm"] == carried
    assert all(np.allclose(before[k].numpy(), after[k].numpy()) for k in same)  # lr 0


def test_eval_runs_a_checkpoint_on_its_own_arm_only(capsys, tmp_path):
    with pytest.raises(SystemExit):
        eval_main(["--robot", "ur5e", "--ckpt", str(shipped_checkpoint()), "--task", "reach"])
    err = capsys.readouterr().err.strip()
    assert "was trained for fr3, not ur5e" in err and len(err.splitlines()) == 1
    ur5e = tmp_path / "ur5e"
    save_checkpoint(ur5e, random_checkpoint(spec=default_spec(image_size=32, robot="ur5e")))
    assert eval_main(["--ckpt", str(ur5e), "--task", "reach", "--via", "inprocess",
                      "--episodes", "1", "--json", "--no-progress"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 1 and summary["inference_latency_ms"]["count"] > 0


def test_ab_compares_engines_on_a_simulated_arm_with_that_arms_checkpoint(capsys):
    fr3 = str(shipped_checkpoint())
    common = ["--a", "backend=torch", "--b", "backend=onnxruntime", "--task", "reach", "--sim"]
    for argv, reason in (
        (["--robot", "panda", "--ckpt", fr3], "the simulated workcell has fr3, ur5e only"),
        (["--robot", "ur5e", "--ckpt", fr3], "was trained for fr3, not ur5e"),
    ):
        with pytest.raises(SystemExit):
            ab_main([*common, *argv])
        err = capsys.readouterr().err.strip()
        assert reason in err and len(err.splitlines()) == 1, err
