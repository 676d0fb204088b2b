"""`./dev.sh lerobot-check`: datasets both ways between this runtime and the real lerobot.

    python -m vla_runtime.data.lerobot.roundtrip_check --lerobot-python .venv-lerobot/bin/python

(a) our writer writes a dataset; lerobot's LeRobotDataset (in the lerobot environment) loads
    it and compares frames, lengths and tasks with what was written;
(b) lerobot writes a dataset with its defaults (AV1, several episodes per file); our reader
    loads it, compares it with what lerobot was given (values exact, frames within the codec's
    loss), checks our stats functions against lerobot's stats.json, and trains one step on it.

Prints one JSON line per step; exits non-zero when a step fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from vla_runtime.core.help_text import CommandParser
from vla_runtime.data.lerobot import lerobot_side
from vla_runtime.data.lerobot.reader import load_episode, load_metadata
from vla_runtime.data.lerobot.schema import IMAGE_PREFIX
from vla_runtime.data.lerobot.stats import feature_stats, image_stats, merge_stats
from vla_runtime.data.lerobot.writer import Episode, LeRobotWriter
from vla_runtime.data.train import train

REPO = Path(__file__).resolve().parents[3]
# Our stats against lerobot's: lerobot accumulates in float32.
STATS_TOLERANCE = 1e-4


def _run_lerobot(python: str, action: str, root: Path) -> dict:
    command = [python, "-m", "vla_runtime.data.lerobot.lerobot_side", action, str(root)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 and not lines:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    result["exit_code"] = done.returncode
    return result


def ours_to_lerobot(python: str, root: Path) -> dict:
    size = (lerobot_side.SIZE, lerobot_side.SIZE)
    writer = LeRobotWriter(
        root, lerobot_side.FPS, {c: size for c in lerobot_side.CAMERAS}, lerobot_side.NAMES,
        lerobot_side.NAMES, env_state_names=["x", "y", "z"],
    )  # fmt: skip
    expected = {}
    for index, (n, task) in enumerate(zip(lerobot_side.LENGTHS, lerobot_side.TASKS, strict=True)):
        arrays = lerobot_side.episode_arrays(index, n)
        writer.add_episode(Episode(
            images={c: arrays[c] for c in lerobot_side.CAMERAS}, state=arrays["state"],
            action=arrays["action"], task=task, success=True, seed=index,
            env_state=arrays["env_state"],
        ))  # fmt: skip
        expected.update({f"{index}/{k}": v for k, v in arrays.items()})
    np.savez(lerobot_side.expected_path(root), lengths=np.array(lerobot_side.LENGTHS),
             tasks=np.array(lerobot_side.TASKS), **expected)  # fmt: skip
    return {"step": "ours -> lerobot", **_run_lerobot(python, "read", root)}


def _stats_error(ours: dict, theirs: dict) -> float:
    return max(
        float(np.abs(np.asarray(ours[k], np.float64) - np.asarray(theirs[k], np.float64)).max())
        for k in ("min", "max", "mean", "std", "q01", "q10", "q50", "q90", "q99")
    )


def lerobot_to_ours(python: str, root: Path, out: Path) -> dict:
    written = _run_lerobot(python, "write", root)
    if written["exit_code"]:
        return {"step": "lerobot -> ours", "problems": [f"lerobot could not write: {written}"]}
    expected = np.load(lerobot_side.expected_path(root))
    meta = load_metadata(root)
    problems, worst_psnr, lengths = [], np.inf, []
    for index, task in enumerate(lerobot_side.TASKS):
        episode = load_episode(meta, index)
        lengths.append(len(episode.state))
        if episode.task != task:
            problems.append(f"episode {index}: task {episode.task!r}")
        for name in ("state", "action", "env_state"):
            if not np.array_equal(getattr(episode, name), expected[f"{index}/{name}"]):
                problems.append(f"episode {index}: {name} differs")
        for camera, frames in episode.images.items():
            for decoded, source in zip(frames, expected[f"{index}/{camera}"], strict=True):
                worst_psnr = min(worst_psnr, lerobot_side.psnr(decoded, source))
    if lengths != list(lerobot_side.LENGTHS):
        problems.append(f"episode lengths {lengths}")
    if worst_psnr < lerobot_side.MIN_PSNR_DB:
        problems.append(f"frames differ: PSNR {worst_psnr:.1f} dB")
    # Our stats of what lerobot was given against lerobot's own meta/stats.json.
    episodes = range(len(lerobot_side.LENGTHS))
    ours = {
        "action": merge_stats([feature_stats(expected[f"{i}/action"]) for i in episodes]),
        **{
            IMAGE_PREFIX + c: merge_stats([image_stats(expected[f"{i}/{c}"]) for i in episodes])
            for c in lerobot_side.CAMERAS
        },
    }
    stats_error = max(_stats_error(ours[k], meta.stats[k]) for k in ours)
    if stats_error > STATS_TOLERANCE:
        problems.append(f"our stats differ from lerobot's by {stats_error}")
    summary = train([str(root)], out, steps=1, batch_size=4, save_every=1, progress=False)
    if summary["completed_steps"] != 1 or not np.isfinite(summary["final_loss"]):
        problems.append(f"training: {summary}")
    return {"step": "lerobot -> ours", "codecs": written["codecs"],
            "data_files": written["data_files"], "video_files": written["video_files"],
            "episode_lengths": lengths, "worst_psnr_db": round(worst_psnr, 1),
            "max_stats_error_vs_lerobot": stats_error, "fallbacks": meta.fallbacks,
            "trained_steps": summary["completed_steps"], "final_loss": summary["final_loss"],
            "problems": problems}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lerobot-python", required=True, help="python of .venv-lerobot")
    parser.add_argument("--workdir", type=Path, help="keep the datasets here (default: temp)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temp:
        work = args.workdir or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        results = [
            ours_to_lerobot(args.lerobot_python, work / "written_by_vla_runtime"),
            lerobot_to_ours(args.lerobot_python, work / "written_by_lerobot", work / "ckpt"),
        ]
    for result in results:
        print(json.dumps(result))
    failed = [r["step"] for r in results if r.get("problems")]
    print(f"lerobot round trip: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
