"""A dataset in lerobot's own layout (made here without lerobot): three episodes in one data
file, one AV1 video per camera holding all of them, no columns of our writer (`success`,
checksums, `next.success`). The reader slices each episode out of the shared files, and
training runs on it."""

from __future__ import annotations

import json

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vla_runtime.data.lerobot.reader import load_episode, load_metadata
from vla_runtime.data.lerobot.schema import DatasetError
from vla_runtime.data.lerobot.video import encode_video
from vla_runtime.data.train import train

FPS = 20
SIZE = 32
LENGTHS = (7, 9, 6)
TASKS = ("touch the red cube", "touch the blue cube", "touch the red cube")
CAMERAS = ("scene", "wrist")
# lerobot's default encoder settings (libsvtav1: keyframe every 2 frames, crf 30, fastest)
AV1_OPTIONS = {"g": "2", "crf": "30", "preset": "12"}


def _frames(n: int, seed: int) -> np.ndarray:
    """A gradient whose brightness jumps by 50+ levels from frame to frame, with a 12 px block
    moving across it: every frame is far from its neighbours, as a wrong slice would show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    base = np.stack([x * 3, y * 3, (x + y) * 1.5], axis=-1)
    frames = np.empty((n, SIZE, SIZE, 3), np.uint8)
    for t in range(n):
        frames[t] = base + (t * 53) % 120
        r, c = (t * 7) % (SIZE - 12), (t * 11) % (SIZE - 12)
        frames[t, r : r + 12, c : c + 12] = rng.integers(40, 255, 3)
    return frames


def _write_lerobot_layout(root, codec: str = "libsvtav1", options=AV1_OPTIONS) -> dict:
    """What lerobot's LeRobotDataset.create/add_frame/save_episode leaves on disk (v3.0)."""
    rng = np.random.default_rng(0)
    total = sum(LENGTHS)
    written = {
        "state": rng.normal(size=(total, 8)).astype(np.float32),
        "action": rng.normal(size=(total, 8)).astype(np.float32),
        "env_state": rng.normal(size=(total, 3)).astype(np.float32),
        **{camera: _frames(total, seed) for seed, camera in enumerate(CAMERAS)},
    }
    episode_index = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])
    frame_index = np.arange(total) - starts[episode_index]
    task_ids = {task: i for i, task in enumerate(dict.fromkeys(TASKS))}
    (root / "data" / "chunk-000").mkdir(parents=True)
    vector = lambda a: pa.array(list(a), pa.list_(pa.float32(), a.shape[1]))  # noqa: E731
    pq.write_table(pa.table({
        "observation.state": vector(written["state"]),
        "action": vector(written["action"]),
        "observation.environment_state": vector(written["env_state"]),
        "timestamp": pa.array(frame_index / FPS, pa.float32()),
        "frame_index": pa.array(frame_index, pa.int64()),
        "episode_index": pa.array(episode_index, pa.int64()),
        "index": pa.array(np.arange(total), pa.int64()),
        "task_index": pa.array([task_ids[TASKS[e]] for e in episode_index], pa.int64()),
    }), root / "data" / "chunk-000" / "file-000.parquet")  # fmt: skip
    rows = []
    for e, (n, start) in enumerate(zip(LENGTHS, starts, strict=True)):
        row = {"episode_index": e, "tasks": [TASKS[e]], "length": n,
               "data/chunk_index": 0, "data/file_index": 0,
               "dataset_from_index": int(start), "dataset_to_index": int(start + n)}  # fmt: skip
        for camera in CAMERAS:
            key = f"videos/observation.images.{camera}"
            row |= {f"{key}/chunk_index": 0, f"{key}/file_index": 0,
                    f"{key}/from_timestamp": start / FPS,
                    f"{key}/to_timestamp": (start + n) / FPS}  # fmt: skip
        rows.append(row | {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "meta/episodes/chunk-000/file-000.parquet")
    pq.write_table(
        pa.table({"task_index": list(task_ids.values()), "task": list(task_ids)}),
        root / "meta" / "tasks.parquet",
    )
    features = {
        "observation.state": {"dtype": "float32", "shape": [8], "names": None},
        "action": {"dtype": "float32", "shape": [8], "names": None},
        "observation.environment_state": {"dtype": "float32", "shape": [3], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        **{k: {"dtype": "int64", "shape": [1], "names": None}
           for k in ("frame_index", "episode_index", "index", "task_index")},
    }  # fmt: skip
    for camera in CAMERAS:
        key = f"observation.images.{camera}"
        features[key] = {"dtype": "video", "shape": [SIZE, SIZE, 3],
                         "names": ["height", "width", "channels"],
                         "info": {"video.codec": "av1", "video.fps": FPS}}  # fmt: skip
        video = root / "videos" / key / "chunk-000" / "file-000.mp4"
        video.parent.mkdir(parents=True)
        encode_video(video, written[camera], FPS, codec, options)
    info = {"codebase_version": "v3.0", "robot_type": "fr3", "fps": FPS,
            "total_episodes": len(LENGTHS), "total_frames": total, "total_tasks": len(task_ids),
            "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
            "features": features}  # fmt: skip
    (root / "meta" / "info.json").write_text(json.dumps(info))
    return written


def _mean_abs_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


@pytest.mark.parametrize("codec, options", [("libsvtav1", AV1_OPTIONS), ("libx264", {}),
                                            ("mpeg4", {})])  # fmt: skip
def test_episodes_slice_out_of_shared_files(tmp_path, codec, options):
    written = _write_lerobot_layout(tmp_path, codec, options)
    video = tmp_path / "videos/observation.images.scene/chunk-000/file-000.mp4"
    with av.open(str(video)) as container:
        assert container.streams.video[0].codec_context.name in {
            "libsvtav1": ("libdav1d", "av1"), "libx264": ("h264",), "mpeg4": ("mpeg4",)
        }[codec]  # fmt: skip
    meta = load_metadata(tmp_path)
    assert meta.tasks == ["touch the red cube", "touch the blue cube"]
    assert meta.leftovers == []
    assert any("success" in note for note in meta.fallbacks)  # said once, at load
    start = 0
    for index, n in enumerate(LENGTHS):
        episode = load_episode(meta, index)
        frames = slice(start, start + n)
        assert len(episode.state) == n and episode.task == TASKS[index] and episode.success
        np.testing.assert_array_equal(episode.state, written["state"][frames])
        np.testing.assert_array_equal(episode.action, written["action"][frames])
        np.testing.assert_array_equal(episode.env_state, written["env_state"][frames])
        np.testing.assert_allclose(episode.timestamp, np.arange(n) / FPS, atol=1e-6)
        assert episode.seed == -1 and not episode.frame_success.any()
        for camera in CAMERAS:
            decoded, source = episode.images[camera], written[camera]
            assert decoded.shape == (n, SIZE, SIZE, 3)
            for t in range(n):
                own = _mean_abs_error(decoded[t], source[start + t])
                assert own < 16.0, (codec, index, camera, t, own)  # lossy, but the same picture
                for other in (start + t - 1, start + t + 1):  # not a neighbouring frame
                    if 0 <= other < len(source):
                        assert _mean_abs_error(decoded[t], source[other]) > own + 20.0
        start += n


def test_a_missing_training_feature_is_named(tmp_path):
    _write_lerobot_layout(tmp_path, "mpeg4", {})
    info = json.loads((tmp_path / "meta" / "info.json").read_text())
    del info["features"]["action"]
    (tmp_path / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"no `action` feature; .*needs per-frame"):
        load_episode(load_metadata(tmp_path), 0)


@pytest.mark.usefixtures("torch_one_thread")
def test_training_runs_on_the_foreign_dataset(tmp_path):
    data, out = tmp_path / "data", tmp_path / "ckpt"
    data.mkdir()
    _write_lerobot_layout(data)
    summary = train([str(data)], out, steps=1, batch_size=4, save_every=1, progress=False)
    assert summary["completed_steps"] == 1 and np.isfinite(summary["final_loss"])
    assert summary["episodes"] == 3 and summary["frames"] == sum(LENGTHS)
    assert summary["skipped_failed_episodes"] == 0
    assert summary["final_aux_loss"] is not None  # the environment state feeds the aux head
    assert (out / "model.safetensors").is_file()
