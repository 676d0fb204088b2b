"""The half of `./dev.sh lerobot-check` that runs inside .venv-lerobot (the real lerobot).

    python -m vla_runtime.data.lerobot.lerobot_side write DIR    lerobot writes a dataset with
                                                                 its defaults (AV1, several
                                                                 episodes per file) plus
                                                                 DIR.expected.npz
    python -m vla_runtime.data.lerobot.lerobot_side read DIR     lerobot loads a dataset that
                                                                 our writer wrote and compares
                                                                 it with DIR.expected.npz

Only numpy and the standard library at module top: this module must import in either
environment, and lerobot (with its torch) only in the one that has it. Prints one JSON line;
exits non-zero when something does not match.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

FPS = 20
SIZE = 32
CAMERAS = ("scene", "wrist")
LENGTHS = (7, 9, 6)
TASKS = ("touch the red cube", "touch the blue cube", "touch the red cube")
NAMES = [f"fr3_joint{i}" for i in range(1, 8)] + ["gripper_width"]
# Frame match after one lossy encode (worst frame; colour blocks on 32 px frames lose most to
# chroma subsampling): a neighbouring frame, the block elsewhere, scores about 15 dB.
MIN_PSNR_DB = 22.0


def expected_path(root: Path) -> Path:
    return root.with_name(root.name + ".expected.npz")


def smooth_frames(n: int, seed: int) -> np.ndarray:
    """(n, SIZE, SIZE, 3) uint8: a gradient with a moving block, what a codec meets in the sim."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    base = np.stack([x * 6, y * 6, (x + y) * 3], axis=-1).astype(np.uint8)
    frames = np.repeat(base[None], n, axis=0)
    for t in range(n):
        r, c = rng.integers(0, SIZE - 10, 2)
        frames[t, r : r + 10, c : c + 10] = rng.integers(0, 255, 3)
    return frames


def episode_arrays(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "state": rng.normal(size=(n, 8)).astype(np.float32),
        "action": rng.normal(size=(n, 8)).astype(np.float32),
        "env_state": rng.normal(size=(n, 3)).astype(np.float32),
        **{camera: smooth_frames(n, seed * 10 + i) for i, camera in enumerate(CAMERAS)},
    }


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / max(mse, 1e-9)))


def write_with_lerobot(root: Path) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (8,), "names": NAMES},
        "action": {"dtype": "float32", "shape": (8,), "names": NAMES},
        "observation.environment_state": {"dtype": "float32", "shape": (3,), "names": None},
        **{
            f"observation.images.{camera}": {
                "dtype": "video",
                "shape": (SIZE, SIZE, 3),
                "names": ["height", "width", "channels"],
            }
            for camera in CAMERAS
        },
    }
    dataset = LeRobotDataset.create("local/lerobot_written", FPS, features, root=root,
                                    robot_type="fr3", video_backend="pyav")  # fmt: skip
    expected = {}
    for index, (n, task) in enumerate(zip(LENGTHS, TASKS, strict=True)):
        arrays = episode_arrays(index, n)
        for t in range(n):
            frame = {
                "observation.state": arrays["state"][t],
                "action": arrays["action"][t],
                "observation.environment_state": arrays["env_state"][t],
                "task": task,
            }
            for camera in CAMERAS:
                frame[f"observation.images.{camera}"] = arrays[camera][t]
            dataset.add_frame(frame)
        dataset.save_episode()
        expected.update({f"{index}/{k}": v for k, v in arrays.items()})
    dataset.finalize()
    np.savez(expected_path(root), lengths=np.array(LENGTHS), tasks=np.array(TASKS), **expected)
    info = json.loads((root / "meta" / "info.json").read_text())
    codecs = {k: f["info"]["video.codec"] for k, f in info["features"].items() if "info" in f}
    data_files = sorted(str(p.relative_to(root)) for p in root.glob("data/**/*.parquet"))
    video_files = sorted(str(p.relative_to(root)) for p in root.glob("videos/**/*.mp4"))
    return {"wrote": str(root), "episodes": len(LENGTHS), "frames": int(sum(LENGTHS)),
            "codecs": codecs, "data_files": data_files, "video_files": video_files}  # fmt: skip


def read_with_lerobot(root: Path) -> dict:
    """Load with lerobot's LeRobotDataset (PyAV decoding) and compare with what was written."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    expected = np.load(expected_path(root))
    dataset = LeRobotDataset("local/vla_runtime", root=root, video_backend="pyav")
    lengths = [int(x) for x in expected["lengths"]]
    problems = []
    if dataset.num_episodes != len(lengths) or dataset.num_frames != sum(lengths):
        problems.append(f"{dataset.num_episodes} episodes / {dataset.num_frames} frames")
    worst_psnr, worst_value = np.inf, 0.0
    start = 0
    for index, n in enumerate(lengths):
        for t in range(n):
            item = dataset[start + t]
            if int(item["episode_index"]) != index or int(item["frame_index"]) != t:
                problems.append(f"frame {start + t} is episode {int(item['episode_index'])}")
            if item["task"] != str(expected["tasks"][index]):
                problems.append(f"episode {index}: task {item['task']!r}")
            for key, name in (("observation.state", "state"), ("action", "action")):
                error = np.abs(item[key].numpy() - expected[f"{index}/{name}"][t]).max()
                worst_value = max(worst_value, float(error))
            for camera in CAMERAS:
                # lerobot returns float (C, H, W) in [0, 1]
                image = item[f"observation.images.{camera}"].numpy().transpose(1, 2, 0)
                image = np.round(image * 255).astype(np.uint8)
                worst_psnr = min(worst_psnr, psnr(image, expected[f"{index}/{camera}"][t]))
        start += n
    if worst_value > 0:
        problems.append(f"state/action differ by up to {worst_value}")
    if worst_psnr < MIN_PSNR_DB:
        problems.append(f"frames differ: PSNR {worst_psnr:.1f} dB < {MIN_PSNR_DB}")
    stats_keys = sorted(dataset.meta.stats)
    return {"read": str(root), "episodes": dataset.num_episodes, "frames": dataset.num_frames,
            "episode_lengths": lengths, "worst_psnr_db": round(worst_psnr, 1),
            "max_value_error": worst_value, "stats_keys": stats_keys,
            "problems": problems}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["write", "read"])
    parser.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    if args.action == "write":
        result = write_with_lerobot(args.root)
    else:
        result = read_with_lerobot(args.root)
    print(json.dumps(result))
    return 1 if result.get("problems") else 0


if __name__ == "__main__":
    sys.exit(main())
