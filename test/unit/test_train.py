"""`vla-runtime train` on a tiny synthetic dataset: the auxiliary head follows the dataset's
environment state, checkpoints load, and rerunning the command resumes."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.data.lerobot_format import Episode, LeRobotWriter
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
