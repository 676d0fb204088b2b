"""What a LeRobot v3 dataset holds and where: file paths, feature keys, info.json features."""

from __future__ import annotations

import hashlib
from pathlib import Path

CODEBASE_VERSION = "v3.0"
CHUNK_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
# This OpenCV build has no H.264/AV1 encoder (lerobot's defaults), so videos are MPEG-4 Part 2
# ("mp4v") in .mp4 containers, which lerobot's decoders (torchcodec/pyav) read.
VIDEO_CODEC = "mpeg4"
FOURCC = "mp4v"
STATE_KEY = "observation.state"
ACTION_KEY = "action"
IMAGE_PREFIX = "observation.images."
# LeRobot's key for privileged simulator state (e.g. the target's position): never a policy
# input, used for auxiliary training losses and analysis.
ENV_STATE_KEY = "observation.environment_state"


class DatasetError(ValueError):
    """The dataset (or one episode of it) is missing, partial or corrupt; the message says which."""


def locate(episode_index: int) -> dict:
    """The chunk and file index of an episode's files (one episode per file)."""
    return {"chunk_index": episode_index // CHUNK_SIZE, "file_index": episode_index % CHUNK_SIZE}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def features(
    fps: float,
    cameras: dict[str, tuple[int, int]],
    state_names: list[str],
    action_names: list[str],
    env_state_names: list[str] | None,
) -> dict:
    """info.json's "features": one video per camera, state, action, env state, frame columns."""
    result = {}
    for name, (height, width) in cameras.items():
        result[IMAGE_PREFIX + name] = {
            "dtype": "video",
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": height,
                "video.width": width,
                "video.codec": VIDEO_CODEC,
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    result[STATE_KEY] = {"dtype": "float32", "shape": [len(state_names)], "names": state_names}
    result[ACTION_KEY] = {"dtype": "float32", "shape": [len(action_names)], "names": action_names}
    if env_state_names:
        result[ENV_STATE_KEY] = {
            "dtype": "float32",
            "shape": [len(env_state_names)],
            "names": env_state_names,
        }
    for key, dtype in (
        ("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
        ("index", "int64"), ("task_index", "int64"), ("next.success", "bool"),
    ):  # fmt: skip
        result[key] = {"dtype": dtype, "shape": [1], "names": None}
    return result
