"""`vla-runtime train` on a tiny synthetic dataset: the auxiliary head follows the dataset's
environment state, checkpoints load, and rerunning the command resumes."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.data.lerobot.writer import Episode, LeRobotWriter
from vla_runtime.data.train import train
from vla_runtime.engine.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("torch_one_thread")
NAMES = [f"fr3_joint{i}" for i in range(1, 8)] + ["gripper_width"]


def _dataset(root, env_state: bool):
    names = ["target_x", "target_y", "target_z"] if env_state else None
    writer = LeRobotWriter(root, 20.0, {"scene": (32, 32), "wrist": (32, 32)}, NAMES, NAMES,
                           env_state_names=names)  # fmt: skip
    rng = np.random.default_rng(0)
    for seed in range(2):
        n = 6
        writer.add_episode(
            Episode(
                images={
                    c: rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8)
                    for c in ("scene", "wrist")
                },  # fmt: skip
                state=rng.normal(size=(n, 8)).astype(np.float32),
                action=rng.normal(size=(n, 8)).astype(np.float32),
                task="touch the red cube",
                success=True,
                seed=seed,
                env_state=rng.normal(size=(n, 3)).astype(np.float32) if env_state else None,
            )
        )


@pytest.mark.parametrize("env_state", [True, False])
def test_train_uses_the_environment_state_and_resumes(tmp_path, env_state):
    data, out = tmp_path / "data", tmp_path / "ckpt"
    _dataset(data, env_state)
    first = train([str(data)], out, steps=2, batch_size=4, save_every=2, progress=False)
    assert first["completed_steps"] == 2 and np.isfinite(first["final_loss"])
    assert (first["final_aux_loss"] is not None) == env_state
    checkpoint = load_checkpoint(out)
    assert checkpoint.model.cfg.aux_dim == (3 if env_state else 0)
    resumed = train([str(data)], out, steps=4, batch_size=4, save_every=2, progress=False)
    assert resumed["completed_steps"] == 4


def test_a_policy_grown_to_see_motion_also_learns_how_far_the_cube_moved(tmp_path):
    """From a plain checkpoint, `earlier_frames` adds the view and three auxiliary outputs (the
    named cube's displacement since that view); the run resumes with them."""
    data, base, motion = tmp_path / "data", tmp_path / "base", tmp_path / "motion"
    _dataset(data, env_state=True)
    train([str(data)], base, steps=2, batch_size=4, save_every=2, progress=False)
    summary = train([str(data)], motion, steps=2, batch_size=4, save_every=2, progress=False,
                    init=base, earlier_frames={"scene": 0.1})  # fmt: skip
    assert np.isfinite(summary["final_aux_loss"])
    model = load_checkpoint(motion).model
    assert (model.cfg.num_cameras, model.cfg.aux_dim) == (3, 6)
    resumed = train([str(data)], motion, steps=4, batch_size=4, save_every=2, progress=False,
                    earlier_frames={"scene": 0.1})  # fmt: skip
    assert resumed["completed_steps"] == 4


def test_delta_chunks_are_relative_to_the_measured_state_and_undo_exactly():
    """Training targets in joint_deltas subtract the frame's arm state (not the gripper), pad
    with the episode's last action, and `chunk_to_positions` restores the absolute rows."""
    from vla_runtime.data.train import TrainingData, action_chunks
    from vla_runtime.engine.model import default_spec
    from vla_runtime.engine.policy import ActionSpace, chunk_to_positions

    state = np.arange(5 * 8, dtype=np.float32).reshape(5, 8)
    action = state + 0.5
    data = TrainingData({}, state, action, np.full(5, 5), np.zeros((1, 4)), np.zeros(5), 1, 0)
    chunks = action_chunks(data, np.array([3]), 4, deltas=True)
    # frame 3: actions 3, 4, 4, 4 (padded) minus state 3 on the arm columns
    assert np.allclose(chunks[0, :, :7], np.array([0.5, 8.5, 8.5, 8.5])[:, None])
    assert np.allclose(chunks[0, :, 7], action[[3, 4, 4, 4], 7])  # gripper stays absolute
    spec = default_spec(chunk_len=4, image_size=32, action_space=ActionSpace.JOINT_DELTAS)
    assert np.allclose(chunk_to_positions(chunks[0], state[3], spec), action[[3, 4, 4, 4]])
    absolute = default_spec(chunk_len=4, image_size=32)
    assert np.allclose(chunk_to_positions(action[:4], state[0], absolute), action[:4])


def test_fine_tuning_into_joint_deltas_keeps_the_weights(tmp_path):
    data, base, tuned = tmp_path / "data", tmp_path / "base", tmp_path / "tuned"
    _dataset(data, env_state=True)
    train([str(data)], base, steps=2, batch_size=4, save_every=2, progress=False)
    summary = train([str(data)], tuned, steps=2, batch_size=4, save_every=2, progress=False,
                    action_space="joint_deltas", init=base, lr=0.0)  # fmt: skip
    assert summary["action_space"] == "joint_deltas"
    before, after = load_checkpoint(base), load_checkpoint(tuned)
    assert after.spec.action_space.value == "joint_deltas"
    for (key, a), (_, b) in zip(before.model.state_dict().items(),
                                after.model.state_dict().items(), strict=True):  # fmt: skip
        assert key and np.allclose(a.numpy(), b.numpy()), key  # lr 0: weights unchanged
    with pytest.raises(ValueError, match="joint_positions"):  # resuming must not switch spaces
        train([str(data)], base, steps=3, batch_size=4, save_every=2, progress=False,
              action_space="joint_deltas")  # fmt: skip


def test_train_records_the_recommended_noise_scale_in_the_shipped_copy(tmp_path):
    from vla_runtime.data.train_cli import train_main

    data, out, ship = tmp_path / "data", tmp_path / "ckpt", tmp_path / "ship"
    _dataset(data, env_state=False)
    common = ["--data", str(data), "--out", str(out), "--steps", "2", "--batch-size", "4",
              "--save-every", "2", "--no-progress"]  # fmt: skip
    with pytest.raises(SystemExit):
        train_main([*common, "--noise-scale", "1.5"])
    assert train_main([*common, "--noise-scale", "0", "--ship", str(ship)]) == 0
    assert load_checkpoint(out).inference == {"noise_scale": 0.0}
    assert load_checkpoint(ship).inference == {"noise_scale": 0.0}
