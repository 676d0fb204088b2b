"""LeRobot dataset format v3.0, written and read with pyarrow + OpenCV (lerobot itself optional).

Layout (as lerobot v3 expects it):

    meta/info.json                      codebase_version "v3.0", fps, features, paths, totals
    meta/stats.json                     per-feature min/max/mean/std/count
    meta/tasks.parquet                  task strings (pandas index "task") -> task_index
    meta/tasks.jsonl                    the same, the v2.1 way, for older readers
    meta/episodes/chunk-CCC/file-FFF.parquet   one row per episode (lengths, file locations,
                                        from/to timestamps, per-episode stats; plus ours:
                                        success, seed, sha256 of every file)
    data/chunk-CCC/file-FFF.parquet     frames: observation.state, action, timestamp, indices
    videos/<camera key>/chunk-CCC/file-FFF.mp4

v3 allows several episodes per file; this writer uses one data file and one video per episode
per camera, which keeps every episode self-contained: an interrupted collection loses at most
the episode being written. An episode exists once its meta/episodes row is written (the commit
point, after its data and videos are renamed into place); files without a row are leftovers of
an interruption, reported and ignored by the reader and overwritten by a resumed writer.

Video codec: this OpenCV build has no H.264/AV1 encoder (lerobot's defaults), so videos are
MPEG-4 Part 2 ("mp4v") in .mp4 containers, which lerobot's decoders (torchcodec/pyav) read.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CODEBASE_VERSION = "v3.0"
CHUNK_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_CODEC = "mpeg4"
FOURCC = "mp4v"
STATE_KEY = "observation.state"
ACTION_KEY = "action"
IMAGE_PREFIX = "observation.images."
# LeRobot's key for privileged simulator state (e.g. the target's position): never a policy
# input, used for auxiliary training losses and analysis.
ENV_STATE_KEY = "observation.environment_state"
STAT_NAMES = ("min", "max", "mean", "std", "count")


class DatasetError(RuntimeError):
    """The dataset (or one episode of it) is missing, partial or corrupt; the message says which."""


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


def _locate(episode_index: int) -> dict:
    return {"chunk_index": episode_index // CHUNK_SIZE, "file_index": episode_index % CHUNK_SIZE}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def _feature_stats(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=np.float64)
    return {
        "min": x.min(0).tolist(),
        "max": x.max(0).tolist(),
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "count": [int(len(x))],
    }


def _merge_stats(parts: list[dict]) -> dict:
    """Pooled min/max/mean/std of per-episode stats (exact: from counts, means, variances)."""
    counts = np.array([p["count"][0] for p in parts], dtype=np.float64)
    means = np.array([p["mean"] for p in parts], dtype=np.float64)
    variances = np.array([p["std"] for p in parts], dtype=np.float64) ** 2
    total = counts.sum()
    weights = (counts / total).reshape(-1, *([1] * (means.ndim - 1)))
    mean = (weights * means).sum(0)
    var = (weights * (variances + (means - mean) ** 2)).sum(0)
    return {
        "min": np.min([p["min"] for p in parts], axis=0).tolist(),
        "max": np.max([p["max"] for p in parts], axis=0).tolist(),
        "mean": mean.tolist(),
        "std": np.sqrt(var).tolist(),
        "count": [int(total)],
    }


def _image_stats(frames: np.ndarray) -> dict:
    """Per-channel stats in [0, 1] with lerobot's (3, 1, 1) shape, from up to 32 frames."""
    step = max(1, len(frames) // 32)
    x = frames[::step].astype(np.float64) / 255.0
    pixels = x.reshape(-1, 3)
    shape = lambda v: np.asarray(v).reshape(3, 1, 1).tolist()  # noqa: E731
    return {
        "min": shape(pixels.min(0)),
        "max": shape(pixels.max(0)),
        "mean": shape(pixels.mean(0)),
        "std": shape(pixels.std(0)),
        "count": [int(len(frames))],
    }


def write_video(path: Path, frames: np.ndarray, fps: float) -> None:
    import cv2

    height, width = frames.shape[1:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*FOURCC), fps, (width, height))
    if not writer.isOpened():
        raise DatasetError(f"OpenCV cannot encode {FOURCC} video to {path}")
    try:
        for frame in frames:
            writer.write(np.ascontiguousarray(frame[:, :, ::-1]))  # RGB -> BGR
    finally:
        writer.release()


def read_video(path: Path) -> np.ndarray:
    """All frames of a video as (T, H, W, 3) uint8 RGB."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    frames = []
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(frame[:, :, ::-1])
    finally:
        capture.release()
    if not frames:
        raise DatasetError(f"{path}: no decodable frames")
    return np.stack(frames)


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

    def features(self) -> dict:
        features = {}
        for name, (height, width) in self.cameras.items():
            features[IMAGE_PREFIX + name] = {
                "dtype": "video",
                "shape": [height, width, 3],
                "names": ["height", "width", "channels"],
                "info": {
                    "video.height": height,
                    "video.width": width,
                    "video.codec": VIDEO_CODEC,
                    "video.pix_fmt": "yuv420p",
                    "video.is_depth_map": False,
                    "video.fps": self.fps,
                    "video.channels": 3,
                    "has_audio": False,
                },
            }
        features[STATE_KEY] = {
            "dtype": "float32", "shape": [len(self.state_names)], "names": self.state_names,
        }  # fmt: skip
        features[ACTION_KEY] = {
            "dtype": "float32", "shape": [len(self.action_names)], "names": self.action_names,
        }  # fmt: skip
        if self.env_state_names:
            features[ENV_STATE_KEY] = {
                "dtype": "float32",
                "shape": [len(self.env_state_names)],
                "names": self.env_state_names,
            }
        for key, dtype in (
            ("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
            ("index", "int64"), ("task_index", "int64"), ("next.success", "bool"),
        ):  # fmt: skip
            features[key] = {"dtype": dtype, "shape": [1], "names": None}
        return features

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
        columns = {}
        if self.env_state_names:
            if episode.env_state is None:
                raise DatasetError(f"this dataset records {ENV_STATE_KEY}; the episode has none")
            env_state = np.asarray(episode.env_state, np.float32)
            if env_state.shape != (n, len(self.env_state_names)):
                raise DatasetError(f"env state {env_state.shape} for {n} frames")
            columns[ENV_STATE_KEY] = pa.array(
                list(env_state), type=pa.list_(pa.float32(), env_state.shape[1])
            )
        index = self.num_episodes
        where = _locate(index)
        task_index = self.tasks.setdefault(episode.task, len(self.tasks))
        timestamp = (
            np.arange(n, dtype=np.float32) / self.fps
            if episode.timestamp is None
            else np.asarray(episode.timestamp, np.float32)
        )
        frame_success = (
            np.zeros(n, bool) if episode.frame_success is None else episode.frame_success
        )
        first = self.total_frames
        table = pa.table(
            {
                STATE_KEY: pa.array(list(state), type=pa.list_(pa.float32(), state.shape[1])),
                ACTION_KEY: pa.array(list(action), type=pa.list_(pa.float32(), action.shape[1])),
                "timestamp": pa.array(timestamp, pa.float32()),
                "frame_index": pa.array(np.arange(n), pa.int64()),
                "episode_index": pa.array(np.full(n, index), pa.int64()),
                "index": pa.array(np.arange(first, first + n), pa.int64()),
                "task_index": pa.array(np.full(n, task_index), pa.int64()),
                "next.success": pa.array(np.asarray(frame_success, bool), pa.bool_()),
                **columns,
            }
        )
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
            "data/sha256": _sha256(data_path),
            "extra": json.dumps(episode.extra),
        }
        stats = {
            STATE_KEY: _feature_stats(state),
            ACTION_KEY: _feature_stats(action),
        }
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
            row[f"videos/{key}/sha256"] = _sha256(video_path)
            stats[key] = _image_stats(frames)
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
            "features": self.features(),
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
        keys = sorted(
            {
                c[len("stats/") :].rsplit("/", 1)[0]
                for c in self.episodes[0]
                if c.startswith("stats/")
            }
        )
        stats = {
            key: _merge_stats(
                [{s: json.loads(r[f"stats/{key}/{s}"]) for s in STAT_NAMES} for r in self.episodes]
            )
            for key in keys
        }
        _write_json_atomic(meta / "stats.json", stats)
        _write_json_atomic(meta / "info.json", info)  # last: totals only count committed rows


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


# ------------------------------------------------------------------------------ reading


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
    if _sha256(data_path) != row["data/sha256"]:
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
            if _sha256(video) != row[f"videos/{key}/sha256"]:
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
