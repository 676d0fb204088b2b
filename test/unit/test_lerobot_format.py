"""LeRobot v3 dataset: write -> read round trip, metadata files, partial and corrupt episodes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from vla_runtime.data.lerobot.reader import load_episode, load_metadata
from vla_runtime.data.lerobot.schema import DatasetError
from vla_runtime.data.lerobot.writer import Episode, LeRobotWriter

NAMES = [f"j{i}" for i in range(7)] + ["gripper_width"]
SIZE = 32


def _frames(n: int, seed: int) -> np.ndarray:
    """Smooth images with moving blocks (what a codec meets in the sim), not white noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    base = np.stack([x * 6, y * 6, (x + y) * 3], axis=-1).astype(np.uint8)
    frames = np.repeat(base[None], n, axis=0)
    for t in range(n):
        r, c = rng.integers(0, SIZE - 8, 2)
        frames[t, r : r + 8, c : c + 8] = rng.integers(0, 255, 3)
    return frames


def _episode(n: int, seed: int, task: str, success: bool) -> Episode:
    rng = np.random.default_rng(seed)
    return Episode(
        images={"scene": _frames(n, seed), "wrist": _frames(n, seed + 100)},
        state=rng.normal(size=(n, 8)).astype(np.float32),
        action=rng.normal(size=(n, 8)).astype(np.float32),
        task=task,
        success=success,
        frame_success=np.arange(n) >= n - 2 if success else np.zeros(n, bool),
        seed=seed,
    )


def _writer(root):
    return LeRobotWriter(root, 20.0, {"scene": (SIZE, SIZE), "wrist": (SIZE, SIZE)}, NAMES, NAMES)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(float) - b.astype(float)) ** 2)
    return 10 * np.log10(255.0**2 / max(mse, 1e-9))


def test_round_trip_frames_actions_and_metadata(tmp_path):
    episodes = [_episode(12, 1, "touch the red cube", True), _episode(9, 2, "pick up it", False)]
    writer = _writer(tmp_path)
    for episode in episodes:
        writer.add_episode(episode)

    meta = load_metadata(tmp_path)
    info = json.loads((tmp_path / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["total_episodes"] == 2 and info["total_frames"] == 21 and info["total_tasks"] == 2
    assert info["features"]["observation.images.scene"]["dtype"] == "video"
    assert info["features"]["action"]["names"] == NAMES
    assert meta.tasks == ["touch the red cube", "pick up it"]
    assert meta.leftovers == []
    tasks = pq.read_table(tmp_path / "meta" / "tasks.parquet")
    assert tasks.column("task").to_pylist() == meta.tasks
    assert b"pandas" in tasks.schema.metadata  # pandas/lerobot index the rows by task string
    stats = json.loads((tmp_path / "meta" / "stats.json").read_text())
    all_actions = np.concatenate([e.action for e in episodes])
    np.testing.assert_allclose(stats["action"]["mean"], all_actions.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["action"]["std"], all_actions.std(0), rtol=1e-5, atol=1e-6)
    assert stats["action"]["count"] == [21]
    assert np.array(stats["observation.images.scene"]["mean"]).shape == (3, 1, 1)

    for index, written in enumerate(episodes):
        loaded = load_episode(meta, index)
        assert loaded.task == written.task and loaded.success == written.success
        assert loaded.seed == written.seed
        np.testing.assert_array_equal(loaded.state, written.state)
        np.testing.assert_array_equal(loaded.action, written.action)
        np.testing.assert_array_equal(loaded.frame_success, written.frame_success)
        np.testing.assert_allclose(loaded.timestamp, np.arange(len(written)) / 20.0, atol=1e-6)
        for camera, frames in written.images.items():
            decoded = loaded.images[camera]
            assert decoded.shape == frames.shape
            assert _psnr(decoded, frames) > 28.0  # lossy mp4v, but the same pictures
    data = pq.read_table(tmp_path / "data" / "chunk-000" / "file-001.parquet").to_pydict()
    assert data["index"] == list(range(12, 21)) and set(data["episode_index"]) == {1}


def test_resumed_writer_appends_and_an_interrupted_episode_is_a_leftover(tmp_path):
    writer = _writer(tmp_path)
    writer.add_episode(_episode(5, 1, "a", True))
    # An interruption after the data file but before the metadata row (the commit point):
    orphan = tmp_path / "data" / "chunk-000" / "file-001.parquet"
    orphan.write_bytes(b"half written")
    meta = load_metadata(tmp_path)
    assert len(meta.episodes) == 1 and meta.leftovers == [orphan]

    resumed = _writer(tmp_path)
    assert resumed.num_episodes == 1
    resumed.add_episode(_episode(6, 2, "b", True))
    meta = load_metadata(tmp_path)
    assert [len(load_episode(meta, i).state) for i in range(2)] == [5, 6]
    assert meta.leftovers == []
    with pytest.raises(DatasetError, match="cannot append"):
        LeRobotWriter(tmp_path, 10.0, {"scene": (SIZE, SIZE)}, NAMES, NAMES)


def test_corrupt_or_missing_files_are_reported_with_the_episode(tmp_path):
    writer = _writer(tmp_path)
    for seed in range(3):
        writer.add_episode(_episode(6, seed, "a", True))
    meta = load_metadata(tmp_path)
    data = tmp_path / "data" / "chunk-000" / "file-000.parquet"
    data.write_bytes(data.read_bytes()[:-20])  # truncated
    with pytest.raises(DatasetError, match="episode 0.*corrupt"):
        load_episode(meta, 0)
    video = tmp_path / "videos" / "observation.images.wrist" / "chunk-000" / "file-001.mp4"
    video.write_bytes(video.read_bytes()[:100])
    with pytest.raises(DatasetError, match="episode 1.*corrupt"):
        load_episode(meta, 1)
    assert load_episode(meta, 1, decode_video=False).state.shape == (6, 8)
    (tmp_path / "videos" / "observation.images.scene" / "chunk-000" / "file-002.mp4").unlink()
    with pytest.raises(DatasetError, match="episode 2.*missing"):
        load_episode(meta, 2)
    with pytest.raises(DatasetError, match="not a LeRobot dataset"):
        load_metadata(tmp_path / "nothing")


def test_environment_state_round_trip_and_required_when_declared(tmp_path):
    names = ["target_x", "target_y", "target_z"]
    writer = LeRobotWriter(
        tmp_path, 20.0, {"scene": (SIZE, SIZE), "wrist": (SIZE, SIZE)}, NAMES, NAMES,
        env_state_names=names,
    )  # fmt: skip
    episode = _episode(7, 3, "touch the red cube", True)
    episode.env_state = np.arange(21, dtype=np.float32).reshape(7, 3) / 10
    writer.add_episode(episode)
    meta = load_metadata(tmp_path)
    assert meta.info["features"]["observation.environment_state"]["names"] == names
    np.testing.assert_array_equal(load_episode(meta, 0).env_state, episode.env_state)
    with pytest.raises(DatasetError, match="environment_state"):
        writer.add_episode(_episode(4, 4, "a", True))  # declared but missing
    wrong = _episode(4, 5, "a", True)
    wrong.env_state = np.zeros((4, 2), np.float32)
    with pytest.raises(DatasetError, match="env state"):
        writer.add_episode(wrong)
    with pytest.raises(DatasetError, match="cannot append"):
        _writer(tmp_path)  # same cameras, but this writer would drop the env state
    # Datasets without it read back as None.
    plain = tmp_path / "plain"
    _writer(plain).add_episode(_episode(3, 6, "a", True))
    assert load_episode(load_metadata(plain), 0).env_state is None
