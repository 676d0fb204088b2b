"""Reading a LeRobot v3 dataset: its committed episodes, each verified against its checksums."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from vla_runtime.data.lerobot.schema import (
    ACTION_KEY,
    CODEBASE_VERSION,
    DATA_PATH,
    ENV_STATE_KEY,
    IMAGE_PREFIX,
    STATE_KEY,
    VIDEO_PATH,
    DatasetError,
    sha256,
)
from vla_runtime.data.lerobot.video import read_video


@dataclass
class DatasetMetadata:
    root: Path
    info: dict
    episodes: list[dict]  # committed rows, by episode_index
    tasks: list[str]  # by task_index
    stats: dict
    leftovers: list[Path]  # files of uncommitted (interrupted) episodes

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.info["features"].items() if f["dtype"] == "video"]

    @property
    def camera_shapes(self) -> dict[str, tuple[int, int]]:
        return {
            k[len(IMAGE_PREFIX) :]: tuple(self.info["features"][k]["shape"][:2])
            for k in self.camera_keys
        }

    def path_of(self, row: dict, key: str | None = None) -> Path:
        if key is None:
            return self.root / DATA_PATH.format(
                chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
            )
        return self.root / VIDEO_PATH.format(
            video_key=key,
            chunk_index=row[f"videos/{key}/chunk_index"],
            file_index=row[f"videos/{key}/file_index"],
        )


def load_metadata(root: str | Path) -> DatasetMetadata:
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise DatasetError(f"{root} is not a LeRobot dataset (no meta/info.json)")
    info = json.loads(info_path.read_text())
    if info.get("codebase_version") != CODEBASE_VERSION:
        raise DatasetError(f"{root}: codebase_version {info.get('codebase_version')}, need v3.0")
    rows = []
    for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        try:
            rows.extend(pq.read_table(path).to_pylist())
        except Exception as exc:
            raise DatasetError(f"{path}: unreadable episode metadata ({exc})") from exc
    rows.sort(key=lambda r: r["episode_index"])
    if [r["episode_index"] for r in rows] != list(range(len(rows))):
        raise DatasetError(f"{root}: episode indices are not 0..{len(rows) - 1}")
    tasks_table = pq.read_table(root / "meta" / "tasks.parquet").to_pylist()
    tasks = [r["task"] for r in sorted(tasks_table, key=lambda r: r["task_index"])]
    stats_path = root / "meta" / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    meta = DatasetMetadata(root, info, rows, tasks, stats, [])
    committed = {meta.path_of(r) for r in rows}
    committed |= {meta.path_of(r, k) for r in rows for k in meta.camera_keys}
    for pattern in ("data/**/*", "videos/**/*"):
        for path in root.glob(pattern):
            if path.is_file() and path not in committed:
                meta.leftovers.append(path)
    return meta


@dataclass
class LoadedEpisode:
    index: int
    task: str
    success: bool
    seed: int
    state: np.ndarray
    action: np.ndarray
    timestamp: np.ndarray
    frame_success: np.ndarray
    images: dict[str, np.ndarray] | None  # camera name -> (T, H, W, 3); None if not decoded
    env_state: np.ndarray | None = None  # (T, D) privileged sim state, when recorded


def load_episode(meta: DatasetMetadata, index: int, decode_video: bool = True) -> LoadedEpisode:
    """Read and verify one episode; DatasetError names what is wrong with it."""
    row = meta.episodes[index]
    what = f"{meta.root} episode {index}"
    data_path = meta.path_of(row)
    if not data_path.is_file():
        raise DatasetError(f"{what}: data file {data_path} missing")
    if sha256(data_path) != row["data/sha256"]:
        raise DatasetError(f"{what}: data file {data_path} is corrupt (checksum mismatch)")
    table = pq.read_table(data_path)
    n = int(row["length"])
    if table.num_rows != n:
        raise DatasetError(f"{what}: {table.num_rows} frames, metadata says {n}")
    columns = table.to_pydict()
    if (
        columns["index"][0] != row["dataset_from_index"]
        or columns["index"][-1] + 1 != row["dataset_to_index"]
    ):
        raise DatasetError(f"{what}: frame indices do not match the episode metadata")
    images = None
    if decode_video:
        images = {}
        for key in meta.camera_keys:
            video = meta.path_of(row, key)
            if not video.is_file():
                raise DatasetError(f"{what}: video {video} missing")
            if sha256(video) != row[f"videos/{key}/sha256"]:
                raise DatasetError(f"{what}: video {video} is corrupt (checksum mismatch)")
            frames = read_video(video)
            if len(frames) != n:
                raise DatasetError(f"{what}: video {video} has {len(frames)} frames, need {n}")
            images[key[len(IMAGE_PREFIX) :]] = frames
    task_index = columns["task_index"][0]
    return LoadedEpisode(
        index=index,
        task=meta.tasks[task_index],
        success=bool(row["success"]),
        seed=int(row["seed"]),
        state=np.asarray(columns[STATE_KEY], np.float32),
        action=np.asarray(columns[ACTION_KEY], np.float32),
        timestamp=np.asarray(columns["timestamp"], np.float32),
        frame_success=np.asarray(columns["next.success"], bool),
        images=images,
        env_state=(
            np.asarray(columns[ENV_STATE_KEY], np.float32) if ENV_STATE_KEY in columns else None
        ),
    )


def open_with_lerobot(root: str | Path, repo_id: str = "local/vla_runtime"):
    """A `lerobot` LeRobotDataset over the same directory, when lerobot is installed."""
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as exc:
        raise DatasetError("lerobot is not installed; use load_metadata/load_episode") from exc
    return LeRobotDataset(repo_id, root=Path(root))
