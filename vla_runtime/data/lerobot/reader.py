"""Reading a LeRobot v3 dataset: ours, or any other (lerobot's own included).

Any v3 layout reads: several episodes per data file and per video file (an episode is its
`episode_index` rows of the data file and its [from_timestamp, to_timestamp) range of each
video), AV1/H.264/MPEG-4 video (PyAV) or images stored in the parquet files. The columns our
writer adds (`success`, `seed`, checksums, `next.success`) are used where present: checksums are
verified, and an episode without `success` counts as successful (a dataset recorded with
lerobot holds demonstrations), said once per dataset.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import pyarrow as pa
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
from vla_runtime.data.lerobot.video import read_video, read_video_frames

log = logging.getLogger(__name__)
# How far a video frame's time may lie from the frame's timestamp (lerobot's default).
FRAME_TOLERANCE_S = 1e-4
_REPORTED: set[tuple[Path, str]] = set()


@dataclass
class DatasetMetadata:
    root: Path
    info: dict
    episodes: list[dict]  # committed rows, by episode_index
    tasks: list[str]  # by task_index
    stats: dict
    leftovers: list[Path]  # files of uncommitted (interrupted) episodes
    fallbacks: list[str] = field(default_factory=list)  # what is missing, what stands in
    _table: tuple[Path, pa.Table] | None = field(default=None, repr=False)  # last data file read

    @property
    def fps(self) -> float:
        return float(self.info["fps"])

    @property
    def camera_keys(self) -> list[str]:
        """Features holding camera frames: videos, or images stored in the data files."""
        return [k for k, f in self.info["features"].items() if f["dtype"] in ("video", "image")]

    @property
    def camera_shapes(self) -> dict[str, tuple[int, int]]:
        """Camera name (the key without "observation.images.") -> (height, width)."""
        shapes = {}
        for key in self.camera_keys:
            feature = self.info["features"][key]
            names = list(feature.get("names") or ["height", "width", "channels"])
            if "height" not in names:  # unnamed axes: lerobot's (height, width, channels)
                names = ["height", "width", "channels"]
            shape = feature["shape"]
            height, width = shape[names.index("height")], shape[names.index("width")]
            shapes[self.camera_name(key)] = (int(height), int(width))
        return shapes

    def camera_name(self, key: str) -> str:
        return key[len(IMAGE_PREFIX) :] if key.startswith(IMAGE_PREFIX) else key

    def path_of(self, row: dict, key: str | None = None) -> Path:
        if key is None:
            return self.root / self.info.get("data_path", DATA_PATH).format(
                chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
            )
        return self.root / (self.info.get("video_path") or VIDEO_PATH).format(
            video_key=key,
            chunk_index=row[f"videos/{key}/chunk_index"],
            file_index=row[f"videos/{key}/file_index"],
        )

    def episode_success(self, index: int) -> bool:
        """Our `success` flag; episodes of datasets without it count as successful."""
        return bool(self.episodes[index].get("success", True))

    def data_table(self, path: Path) -> pa.Table:
        """A data file's table; the last one read is kept, as consecutive episodes share files."""
        if self._table is None or self._table[0] != path:
            self._table = (path, pq.read_table(path))
        return self._table[1]


def _read_tasks(root: Path, rows: list[dict]) -> list[str]:
    path = root / "meta" / "tasks.parquet"
    if path.is_file():
        table = pq.read_table(path)
        # lerobot writes a pandas frame indexed by the task string; older writers without a
        # named index leave it as "__index_level_0__".
        column = "task" if "task" in table.column_names else "__index_level_0__"
        indices, tasks = table.column("task_index").to_pylist(), table.column(column).to_pylist()
        return [task for _, task in sorted(zip(indices, tasks, strict=True))]
    legacy = root / "meta" / "tasks.jsonl"
    if legacy.is_file():
        records = [json.loads(line) for line in legacy.read_text().splitlines() if line.strip()]
        return [r["task"] for r in sorted(records, key=lambda r: r["task_index"])]
    tasks: dict[str, int] = {}
    for row in rows:
        for task in row.get("tasks") or []:
            tasks.setdefault(task, len(tasks))
    return list(tasks)


def load_metadata(root: str | Path) -> DatasetMetadata:
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise DatasetError(f"{root} is not a LeRobot dataset (no meta/info.json)")
    info = json.loads(info_path.read_text())
    if info.get("codebase_version") != CODEBASE_VERSION:
        raise DatasetError(
            f"{root}: codebase_version {info.get('codebase_version')}, need v3.0 (lerobot "
            "converts older datasets: python -m lerobot.datasets.v30.convert_dataset_v21_to_v30)"
        )
    rows = []
    for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        try:
            rows.extend(pq.read_table(path).to_pylist())
        except Exception as exc:
            raise DatasetError(f"{path}: unreadable episode metadata ({exc})") from exc
    rows.sort(key=lambda r: r["episode_index"])
    if [r["episode_index"] for r in rows] != list(range(len(rows))):
        raise DatasetError(f"{root}: episode indices are not 0..{len(rows) - 1}")
    stats_path = root / "meta" / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    meta = DatasetMetadata(root, info, rows, _read_tasks(root, rows), stats, [])
    video_keys = [k for k in meta.camera_keys if info["features"][k]["dtype"] == "video"]
    committed = {meta.path_of(r) for r in rows}
    committed |= {meta.path_of(r, k) for r in rows for k in video_keys}
    for pattern in ("data/**/*", "videos/**/*"):
        for path in root.glob(pattern):
            if path.is_file() and path not in committed:
                meta.leftovers.append(path)
    if rows and "success" not in rows[0]:
        meta.fallbacks.append(
            "episodes carry no `success` flag: every episode counts as a successful demonstration"
        )
    for note in meta.fallbacks:
        if (root.resolve(), note) not in _REPORTED:  # said once per process, not per load
            _REPORTED.add((root.resolve(), note))
            log.warning("%s: %s", root, note)
    return meta


@dataclass
class LoadedEpisode:
    index: int
    task: str
    success: bool
    seed: int  # -1: not recorded
    state: np.ndarray
    action: np.ndarray
    timestamp: np.ndarray
    frame_success: np.ndarray  # all False where the dataset has no `next.success`
    images: dict[str, np.ndarray] | None  # camera name -> (T, H, W, 3); None if not decoded
    env_state: np.ndarray | None = None  # (T, D) privileged sim state, when recorded


def _verify(path: Path, row: dict, column: str, what: str) -> None:
    """Check a file against the checksum our writer records (other writers record none)."""
    if not path.is_file():
        raise DatasetError(f"{what}: {path} missing")
    if column in row and sha256(path) != row[column]:
        raise DatasetError(f"{what}: {path} is corrupt (checksum mismatch)")


def _episode_columns(meta: DatasetMetadata, row: dict, index: int, what: str) -> dict:
    """The episode's frames from its data file, which may hold other episodes too."""
    data_path = meta.path_of(row)
    _verify(data_path, row, "data/sha256", f"{what}: data file")
    try:
        table = meta.data_table(data_path)
    except Exception as exc:
        raise DatasetError(f"{what}: data file {data_path} unreadable ({exc})") from exc
    n = int(row["length"])
    episode_of_row = table.column("episode_index").to_numpy()
    if not (episode_of_row == index).all():  # the file holds other episodes too
        table = table.filter(pa.array(episode_of_row == index))
    if table.num_rows != n:
        raise DatasetError(f"{what}: {table.num_rows} frames, metadata says {n}")
    columns = table.to_pydict()
    if "index" in columns and (
        columns["index"][0] != row["dataset_from_index"]
        or columns["index"][-1] + 1 != row["dataset_to_index"]
    ):
        raise DatasetError(f"{what}: frame indices do not match the episode metadata")
    return columns


def _decode_camera(
    meta: DatasetMetadata, row: dict, key: str, columns: dict, timestamp: np.ndarray, what: str
) -> np.ndarray:
    n = len(timestamp)
    if meta.info["features"][key]["dtype"] == "image":  # encoded images in the data file
        frames = [
            cv2.imdecode(np.frombuffer(cell["bytes"], np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
            for cell in columns[key]
        ]
        return np.stack(frames)
    video = meta.path_of(row, key)
    _verify(video, row, f"videos/{key}/sha256", f"{what}: video")
    if f"videos/{key}/sha256" in row:
        # Our own datasets: one episode per video, every frame of it in order.
        frames = read_video(video)
        if len(frames) != n:
            raise DatasetError(f"{what}: video {video} has {len(frames)} frames, need {n}")
        return frames
    start = float(row.get(f"videos/{key}/from_timestamp", 0.0))
    try:
        return read_video_frames(video, start + timestamp, FRAME_TOLERANCE_S)
    except DatasetError as exc:
        raise DatasetError(f"{what}: {exc}") from exc


def load_episode(meta: DatasetMetadata, index: int, decode_video: bool = True) -> LoadedEpisode:
    """Read and verify one episode; DatasetError names what is wrong with it."""
    row = meta.episodes[index]
    what = f"{meta.root} episode {index}"
    for key in (STATE_KEY, ACTION_KEY):
        if key not in meta.info["features"]:
            raise DatasetError(
                f"{meta.root} has no `{key}` feature; reading episodes needs per-frame "
                f"`{STATE_KEY}` and `{ACTION_KEY}` (features: {sorted(meta.info['features'])})"
            )
    columns = _episode_columns(meta, row, index, what)
    n = int(row["length"])
    timestamp = (
        np.asarray(columns["timestamp"], np.float64)
        if "timestamp" in columns
        else np.arange(n) / meta.fps
    )
    images = None
    if decode_video:
        images = {
            meta.camera_name(key): _decode_camera(meta, row, key, columns, timestamp, what)
            for key in meta.camera_keys
        }
    if "task_index" in columns:
        task = meta.tasks[columns["task_index"][0]]
    else:
        task = (row.get("tasks") or [""])[0]
    return LoadedEpisode(
        index=index,
        task=task,
        success=meta.episode_success(index),
        seed=int(row.get("seed", -1)),
        state=np.asarray(columns[STATE_KEY], np.float32).reshape(n, -1),
        action=np.asarray(columns[ACTION_KEY], np.float32).reshape(n, -1),
        timestamp=timestamp.astype(np.float32),
        frame_success=np.asarray(columns.get("next.success", np.zeros(n, bool)), bool),
        images=images,
        env_state=(
            np.asarray(columns[ENV_STATE_KEY], np.float32).reshape(n, -1)
            if ENV_STATE_KEY in columns
            else None
        ),
    )


def open_with_lerobot(root: str | Path, repo_id: str = "local/vla_runtime"):
    """A `lerobot` LeRobotDataset over the same directory, when lerobot is installed."""
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as exc:
        raise DatasetError("lerobot is not installed; use load_metadata/load_episode") from exc
    return LeRobotDataset(repo_id, root=Path(root))
