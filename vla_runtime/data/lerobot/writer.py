"""Appending episodes to a LeRobot v3 dataset: each episode's data, videos, then its row."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vla_runtime.data.lerobot.reader import load_metadata
from vla_runtime.data.lerobot.schema import (
    ACTION_KEY,
    CHUNK_SIZE,
    CODEBASE_VERSION,
    DATA_PATH,
    ENV_STATE_KEY,
    EPISODES_PATH,
    IMAGE_PREFIX,
    STATE_KEY,
    VIDEO_PATH,
    DatasetError,
    features,
    locate,
    sha256,
)
from vla_runtime.data.lerobot.stats import feature_stats, image_stats, merge_stats
from vla_runtime.data.lerobot.video import write_video


@dataclass
class Episode:
    """One episode in memory. images: camera -> (T, H, W, 3) uint8 RGB."""

    images: dict[str, np.ndarray]
    state: np.ndarray  # (T, state_dim) float32
    action: np.ndarray  # (T, action_dim) float32
    task: str
    success: bool
    timestamp: np.ndarray | None = None  # (T,) s from episode start; default frame / fps
    frame_success: np.ndarray | None = None  # (T,) bool: detector at that frame
    seed: int = -1
    extra: dict = field(default_factory=dict)  # more per-episode metadata (JSON-able scalars)
    env_state: np.ndarray | None = None  # (T, env_state_dim) float32, privileged sim state

    def __len__(self) -> int:
        return len(self.state)


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


class LeRobotWriter:
    """Appends episodes to a LeRobot v3 dataset directory (created, or resumed if it exists)."""

    def __init__(
        self,
        root: str | Path,
        fps: float,
        cameras: dict[str, tuple[int, int]],
        state_names: list[str],
        action_names: list[str],
        robot_type: str = "fr3",
        env_state_names: list[str] | None = None,
    ):
        self.root = Path(root)
        self.fps = float(fps)
        self.cameras = dict(cameras)
        self.state_names = list(state_names)
        self.action_names = list(action_names)
        self.robot_type = robot_type
        self.env_state_names = list(env_state_names) if env_state_names else None
        info_path = self.root / "meta" / "info.json"
        self.episodes: list[dict] = []
        if info_path.is_file():
            existing = load_metadata(self.root)
            existing_env = existing.info["features"].get(ENV_STATE_KEY, {}).get("names")
            existing_robot = existing.info.get("robot_type")
            if existing_robot != self.robot_type:
                raise DatasetError(
                    f"{self.root} holds {existing_robot} episodes; cannot append {self.robot_type}"
                )
            if (
                existing.info["fps"] != self.fps
                or existing.camera_shapes != self.cameras
                or existing_env != self.env_state_names
            ):
                raise DatasetError(
                    f"{self.root} holds a dataset with fps {existing.info['fps']} and cameras "
                    f"{existing.camera_shapes} env state {existing_env}; cannot append fps "
                    f"{self.fps} cameras {self.cameras} env state {self.env_state_names}"
                )
            self.episodes = existing.episodes
        self.tasks: dict[str, int] = {}
        for row in self.episodes:
            for task in row["tasks"]:
                self.tasks.setdefault(task, len(self.tasks))
        self.total_frames = sum(int(row["length"]) for row in self.episodes)

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def add_episode(self, episode: Episode) -> int:
        """Write one episode (data, videos, then its metadata row: the commit point)."""
        n = len(episode)
        if n == 0:
            raise DatasetError("an episode needs at least one frame")
        if set(episode.images) != set(self.cameras):
            raise DatasetError(
                f"episode cameras {sorted(episode.images)} != {sorted(self.cameras)}"
            )
        for name, frames in episode.images.items():
            if frames.shape != (n, *self.cameras[name], 3) or frames.dtype != np.uint8:
                raise DatasetError(f"camera {name}: frames {frames.shape} {frames.dtype}")
        state = np.asarray(episode.state, np.float32)
        action = np.asarray(episode.action, np.float32)
        if state.shape != (n, len(self.state_names)) or action.shape != (n, len(self.action_names)):
            raise DatasetError(f"state {state.shape} / action {action.shape} for {n} frames")
        index = self.num_episodes
        where = locate(index)
        task_index = self.tasks.setdefault(episode.task, len(self.tasks))
        first = self.total_frames
        # The numeric frame features, each of which gets stats as lerobot computes them.
        numeric = {
            STATE_KEY: state,
            ACTION_KEY: action,
            "timestamp": (
                np.arange(n, dtype=np.float32) / self.fps
                if episode.timestamp is None
                else np.asarray(episode.timestamp, np.float32)
            ),
            "frame_index": np.arange(n, dtype=np.int64),
            "episode_index": np.full(n, index, np.int64),
            "index": np.arange(first, first + n, dtype=np.int64),
            "task_index": np.full(n, task_index, np.int64),
        }
        if self.env_state_names:
            if episode.env_state is None:
                raise DatasetError(f"this dataset records {ENV_STATE_KEY}; the episode has none")
            env_state = np.asarray(episode.env_state, np.float32)
            if env_state.shape != (n, len(self.env_state_names)):
                raise DatasetError(f"env state {env_state.shape} for {n} frames")
            numeric[ENV_STATE_KEY] = env_state
        frame_success = (
            np.zeros(n, bool) if episode.frame_success is None else episode.frame_success
        )
        columns = {
            key: pa.array(list(values), type=pa.list_(pa.float32(), values.shape[1]))
            if values.ndim == 2
            else pa.array(values)
            for key, values in numeric.items()
        }
        columns["next.success"] = pa.array(np.asarray(frame_success, bool), pa.bool_())
        table = pa.table(columns)
        data_path = self.root / DATA_PATH.format(**where)
        data_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = data_path.with_name(data_path.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, data_path)
        row = {
            "episode_index": index,
            "tasks": [episode.task],
            "length": n,
            "data/chunk_index": where["chunk_index"],
            "data/file_index": where["file_index"],
            "dataset_from_index": first,
            "dataset_to_index": first + n,
            "meta/episodes/chunk_index": where["chunk_index"],
            "meta/episodes/file_index": where["file_index"],
            "success": bool(episode.success),
            "seed": int(episode.seed),
            "data/sha256": sha256(data_path),
            "extra": json.dumps(episode.extra),
        }
        stats = {key: feature_stats(values) for key, values in numeric.items()}
        for name, frames in episode.images.items():
            key = IMAGE_PREFIX + name
            video_path = self.root / VIDEO_PATH.format(video_key=key, **where)
            video_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = video_path.with_name(video_path.stem + ".tmp.mp4")
            write_video(tmp, frames, self.fps)
            os.replace(tmp, video_path)
            row[f"videos/{key}/chunk_index"] = where["chunk_index"]
            row[f"videos/{key}/file_index"] = where["file_index"]
            row[f"videos/{key}/from_timestamp"] = 0.0
            row[f"videos/{key}/to_timestamp"] = n / self.fps
            row[f"videos/{key}/sha256"] = sha256(video_path)
            stats[key] = image_stats(frames)
        for key, values in stats.items():
            for stat, value in values.items():
                row[f"stats/{key}/{stat}"] = json.dumps(value)
        episodes_path = self.root / EPISODES_PATH.format(**where)
        episodes_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = episodes_path.with_name(episodes_path.name + ".tmp")
        pq.write_table(pa.Table.from_pylist([row]), tmp)
        os.replace(tmp, episodes_path)  # commit point
        self.episodes.append(row)
        self.total_frames += n
        self._write_meta()
        return index

    def _write_meta(self) -> None:
        meta = self.root / "meta"
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": self.num_episodes,
            "total_frames": self.total_frames,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNK_SIZE,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 500,
            "fps": self.fps,
            "splits": {"train": f"0:{self.num_episodes}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH,
            "features": features(
                self.fps, self.cameras, self.state_names, self.action_names, self.env_state_names
            ),
        }
        tasks = sorted(self.tasks.items(), key=lambda item: item[1])
        table = pa.table(
            {"task_index": [i for _, i in tasks], "task": [t for t, _ in tasks]}
        ).replace_schema_metadata({b"pandas": json.dumps(_pandas_index_meta()).encode()})
        tmp = meta / "tasks.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, meta / "tasks.parquet")
        tmp = meta / "tasks.jsonl.tmp"
        tmp.write_text("".join(json.dumps({"task_index": i, "task": t}) + "\n" for t, i in tasks))
        os.replace(tmp, meta / "tasks.jsonl")
        # Features with stats in every row (rows of an older writer hold fewer of them).
        keys = sorted(
            set.intersection(
                *({c[len("stats/") :].rsplit("/", 1)[0] for c in r if c.startswith("stats/")}
                  for r in self.episodes)
            )
        )  # fmt: skip
        stats = {key: merge_stats([_row_stats(r, key) for r in self.episodes]) for key in keys}
        _write_json_atomic(meta / "stats.json", stats)
        _write_json_atomic(meta / "info.json", info)  # last: totals only count committed rows


def _row_stats(row: dict, key: str) -> dict:
    """One feature's stats from an episode row, one JSON value per stat (a row without
    quantiles leaves them out of the merge)."""
    prefix = f"stats/{key}/"
    return {c[len(prefix) :]: json.loads(v) for c, v in row.items() if c.startswith(prefix)}


def _pandas_index_meta() -> dict:
    """pandas metadata making `pandas.read_parquet(tasks.parquet)` index rows by task string,
    as lerobot v3 writes it (a DataFrame of task_index indexed by task)."""
    return {
        "index_columns": ["task"],
        "column_indexes": [],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }  # fmt: skip
