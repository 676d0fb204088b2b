"""`vla-runtime calibrate scheduler --data DIR`: fit the scheduler's thresholds on recorded
episodes and write them as YAML. DIR is either

- episodes of the policy itself, run through the product path with the scheduler
  (`vla-runtime eval --scheduler`, `bench scheduler`: JSONL files, or a folder of them, whose
  episodes carry every decision's signals), or
- LeRobot v3 datasets of demonstrations (`vla-runtime collect`).

**Policy episodes** give what the scheduler really sees: the policy's own motion through the
streamer, the images at the camera rate and the engine's signals (vision dissimilarity, chunk
divergence). Decisions that were forced anyway (episode start, gripper, safety) are left out;
over the rest a cue is unusual above its 90th percentile (PARTIAL cues: acceleration,
divergence, a camera's image change, which marks that camera unstable) or its 97.5th (FULL cues:
image change, vision dissimilarity, divergence), and the arm is at rest below the 10th
percentile of its speed. Travel and the tier layout stay as the base configuration has them.

**Demonstrations**: frames within `--window` steps of a gripper transition (the recorded
action's opening jumps) are critical: they must get full compute, so the gripper cue (planned
change `--window` actions ahead, finger speed, opening delta) is sized from them. The other
thresholds come from the non-critical frames (transport, approach), as percentiles: an arm "at
rest" is slower than 90 % of them, an acceleration or image change above the 90th / 97.5th
percentile is unusual, a camera whose change over one inference interval is below its median is
stable. Demonstrations have no engine signals: those thresholds stay as the base has them.

Either way the fitted configuration is replayed through the scheduler itself
(`core/scheduler.py`; for demonstrations with their future actions as the plan): the report
gives the share of each tier (and, for demonstrations, of critical inferences that ran full).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from vla_runtime.core.gripper import opening_from_width
from vla_runtime.core.help_text import CommandParser, help_summary
from vla_runtime.core.paths import config_dir
from vla_runtime.core.scene_change import change, thumbnail
from vla_runtime.core.scheduler import (
    FORCING_FLAGS,
    FULL,
    TIER_NAMES,
    PhaseScheduler,
    SchedulerConfig,
    Signals,
    TierPolicy,
)
from vla_runtime.data.lerobot.reader import load_episode, load_metadata

GRIPPER_COLUMN = 7  # state/action: 7 arm joints + gripper width (m, both fingers)


def critical_frames(gripper: np.ndarray, window: int, jump_fraction: float = 0.1) -> np.ndarray:
    """Frames within `window` steps of a gripper transition: a commanded width step larger than
    `jump_fraction` of the episode's commanded range."""
    span = float(gripper.max() - gripper.min())
    critical = np.zeros(len(gripper), bool)
    if span <= 0:
        return critical
    jumps = np.flatnonzero(np.abs(np.diff(gripper)) > jump_fraction * span) + 1
    for j in jumps:
        critical[max(0, j - window) : j + window + 1] = True
    return critical


def episode_features(state, action, images: dict, dt: float, window: int, execute: int) -> dict:
    """Per-frame features of one episode, as the scheduler would see them."""
    arm = state[:, :GRIPPER_COLUMN]
    lag = max(1, round(0.1 / dt))  # the tracker's 0.1 s finite-difference window
    speed = np.full(len(arm), np.nan)
    speed[lag:] = np.abs(arm[lag:] - arm[:-lag]).max(axis=1) / (lag * dt)
    accel = np.full(len(arm), np.nan)
    velocity = np.full(arm.shape, np.nan)
    velocity[lag:] = (arm[lag:] - arm[:-lag]) / (lag * dt)
    accel[2 * lag :] = np.abs(velocity[2 * lag :] - velocity[lag:-lag]).max(axis=1) / (lag * dt)
    width = state[:, GRIPPER_COLUMN]
    finger_speed = np.full(len(arm), np.nan)
    finger_speed[1:] = opening_from_width(np.abs(np.diff(width))) / dt
    changes = {}
    for camera, frames in images.items():
        thumbs = [thumbnail(f) for f in frames]
        values = np.full(len(arm), np.nan)
        for t in range(execute, len(thumbs)):
            values[t] = change(thumbs[t], thumbs[t - execute])
        changes[camera] = values
    return {
        "critical": critical_frames(action[:, GRIPPER_COLUMN], window),
        "speed": speed,
        "acceleration": accel,
        "finger_speed": finger_speed,
        "image_change": changes,
        "gripper_span": float(np.ptp(action[:, GRIPPER_COLUMN])),
    }


def _percentile(values: np.ndarray, q: float, default: float) -> float:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, q)) if values.size else default


def fit(features: list[dict], base: SchedulerConfig, window: int) -> SchedulerConfig:
    def pooled(key, critical: bool | None = None):
        parts = []
        for f in features:
            values = f[key]
            parts.append(values if critical is None else values[f["critical"] == critical])
        return np.concatenate(parts) if parts else np.array([])

    cameras = sorted({c for f in features for c in f["image_change"]})
    per_camera = {
        c: np.concatenate(
            [f["image_change"][c][~f["critical"]] for f in features if c in f["image_change"]]
        )
        for c in cameras
    }
    stable = {c: _percentile(v, 50, base.image_change_stable) for c, v in per_camera.items()}
    all_changes = np.concatenate(list(per_camera.values())) if per_camera else np.array([])
    span = float(np.median([f["gripper_span"] for f in features]))
    critical_finger = pooled("finger_speed", critical=True)
    return SchedulerConfig.from_dict(
        {
            **base.to_dict(),
            "static_joint_speed": _percentile(pooled("speed", False), 10, base.static_joint_speed),
            "acceleration_partial": _percentile(
                pooled("acceleration", False), 90, base.acceleration_partial
            ),
            "image_change_stable": min(stable.values(), default=base.image_change_stable),
            "camera_stable": stable,
            "image_change_full": _percentile(all_changes, 97.5, base.image_change_full),
            "gripper_delta": opening_from_width(0.1 * span) if span > 0 else base.gripper_delta,
            # a quarter of the finger speed seen while it actually moves near transitions
            "gripper_speed": 0.25 * _percentile(critical_finger[critical_finger > 0], 50, 0.0)
            or base.gripper_speed,
            "gripper_plan_steps": window,
        }
    )


def replay(config: SchedulerConfig, state, action, images: dict, dt: float, execute: int,
           critical: np.ndarray) -> tuple[Counter, Counter, int, int]:  # fmt: skip
    """Run the scheduler over one episode at the inference rate; (tier counts, reason counts,
    critical inferences, of which full)."""
    scheduler = PhaseScheduler(config)
    tracker = scheduler.tracker
    tiers, reasons, crit, crit_full = Counter(), Counter(), 0, 0
    horizon = 16
    for t in range(len(state)):
        opening = opening_from_width(state[t, GRIPPER_COLUMN])
        tracker.joint_state(t * dt, state[t, :GRIPPER_COLUMN], opening)
        for camera, frames in images.items():
            tracker.image(camera, frames[t])
        if t % execute:
            continue
        # the plan: the demonstration's next actions, action k at t*dt + (k + 1) dt
        plan = action[t + 1 : t + 1 + horizon, GRIPPER_COLUMN]
        tracker.plan(t * dt, dt, opening_from_width(plan))
        _, decision = scheduler.decide()
        scheduler.inference_done(decision.mode, {})
        tiers[TIER_NAMES[decision.tier]] += 1
        reasons.update(decision.reasons)
        if critical[t]:
            crit += 1
            crit_full += decision.tier == FULL
    return tiers, reasons, crit, crit_full


def calibrate(data_dirs, base: SchedulerConfig, window: int, execute: int,
              max_episodes: int | None = None) -> tuple[SchedulerConfig, dict]:  # fmt: skip

    episodes = []
    for root in data_dirs:
        meta = load_metadata(root)
        dt = 1.0 / float(meta.info["fps"])
        for index in range(len(meta.episodes)):
            if max_episodes is not None and len(episodes) >= max_episodes:
                break
            episode = load_episode(meta, index)
            if episode.success:  # failed demonstrations teach the wrong phases
                episodes.append((episode, dt))
    if not episodes:
        raise ValueError(f"no successful episodes in {list(map(str, data_dirs))}")
    features = [
        episode_features(e.state, e.action, e.images, dt, window, execute) for e, dt in episodes
    ]
    config = fit(features, base, window)
    tiers, reasons, crit, crit_full = Counter(), Counter(), 0, 0
    for (e, dt), f in zip(episodes, features, strict=True):
        t, r, c, cf = replay(config, e.state, e.action, e.images, dt, execute, f["critical"])
        tiers.update(t)
        reasons.update(r)
        crit, crit_full = crit + c, crit_full + cf
    total = sum(tiers.values())
    report = {
        "episodes": len(episodes),
        "frames": int(sum(len(e.state) for e, _ in episodes)),
        "critical_frame_share": float(np.mean(np.concatenate([f["critical"] for f in features]))),
        "replay_tier_share": {k: tiers[k] / total for k in TIER_NAMES},
        "replay_critical_full_share": crit_full / crit if crit else None,
        "replay_reason_share": {k: v / total for k, v in reasons.most_common()},
        "window": window,
        "execute": execute,
    }
    return config, report


# ------------------------------------------------------------------------ policy episodes
def load_decisions(paths) -> list[list[dict]]:
    """Per episode, the scheduler's recorded decisions, from eval JSONL files or folders of
    them (episodes that ran without the scheduler have none and are skipped)."""
    files = []
    for path in map(Path, paths):
        files += sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    episodes = []
    for file in files:
        for line in file.read_text().splitlines():
            if line.strip():
                decisions = json.loads(line).get("scheduler_signals") or []
                if decisions:
                    episodes.append(decisions)
    return episodes


def _free(decision: dict, base: SchedulerConfig) -> bool:
    """A decision no cue could make cheaper: forced full (episode start, gripper, safety)."""
    started = decision.get("episode_time_s", float("inf")) >= base.start_full_s
    return started and not any(decision.get(k) for k in FORCING_FLAGS)


def fit_decisions(episodes: list[list[dict]], base: SchedulerConfig) -> SchedulerConfig:
    free = [d for episode in episodes for d in episode if _free(d, base)]
    if not free:
        raise ValueError("no unforced scheduler decisions in the episodes")

    def values(*keys) -> np.ndarray:
        return np.array([d[k] for d in free for k in keys if k in d], dtype=float)

    cameras = sorted({k[len("image_change_") :] for d in free for k in d
                      if k.startswith("image_change_")})  # fmt: skip
    changes = [f"image_change_{c}" for c in cameras]
    stable = {c: _percentile(values(f"image_change_{c}"), 90, base.stable_threshold(c))
              for c in cameras}  # fmt: skip
    dissimilarity = [k for k in {k for d in free for k in d} if k.startswith("dissimilarity_")]
    return SchedulerConfig.from_dict(
        {
            **base.to_dict(),
            "static_joint_speed": _percentile(values("joint_speed"), 10, base.static_joint_speed),
            "acceleration_partial": _percentile(
                values("joint_acceleration"), 90, base.acceleration_partial
            ),
            "divergence_partial": _percentile(values("divergence"), 90, base.divergence_partial),
            "divergence_full": _percentile(values("divergence"), 97.5, base.divergence_full),
            "dissimilarity_full": _percentile(
                values(*dissimilarity), 97.5, base.dissimilarity_full
            ),
            "image_change_stable": min(stable.values(), default=base.image_change_stable),
            "camera_stable": stable,
            "image_change_full": _percentile(values(*changes), 97.5, base.image_change_full),
        }
    )


def replay_decisions(config: SchedulerConfig, episodes: list[list[dict]]) -> dict:
    """The tiers `config` gives the recorded signals, episode by episode (the travel since a
    full refresh is as recorded)."""
    tiers, reasons, total = Counter(), Counter(), 0
    for episode in episodes:
        policy = TierPolicy(config)
        for values in episode:
            decision = policy.decide(Signals.from_values(values))
            policy.commit(decision, decision.mode)
            tiers[TIER_NAMES[decision.tier]] += 1
            reasons.update(decision.reasons)
            total += 1
    return {
        "replay_tier_share": {k: tiers[k] / total for k in TIER_NAMES},
        "replay_reason_share": {k: v / total for k, v in reasons.most_common()},
    }


def calibrate_from_policy(paths, base: SchedulerConfig) -> tuple[SchedulerConfig, dict]:
    episodes = load_decisions(paths)
    if not episodes:
        raise ValueError(f"no episode with scheduler decisions in {list(map(str, paths))}")
    config = fit_decisions(episodes, base)
    decisions = sum(len(e) for e in episodes)
    free = sum(_free(d, base) for e in episodes for d in e)
    report = {
        "source": "policy episodes (scheduler decisions)",
        "episodes": len(episodes),
        "decisions": decisions,
        "unforced_decisions": free,
        "recorded_tier_share": {
            k: sum(d.get("tier") == k for e in episodes for d in e) / decisions for k in TIER_NAMES
        },
        **replay_decisions(config, episodes),
    }
    return config, report


def is_lerobot_dataset(path: str | Path) -> bool:
    return (Path(path) / "meta" / "info.json").is_file()


def calibrate_main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="vla-runtime calibrate scheduler", description=help_summary(__doc__)
    )
    parser.add_argument("--data", nargs="+", required=True,
                        help="eval JSONL files / folders of them (the policy's episodes with the "
                             "scheduler), or LeRobot dataset directories")  # fmt: skip
    parser.add_argument("--out", default="calibration/scheduler.yaml", help="YAML to write")
    parser.add_argument("--base", help="start from this config (default config/scheduler.yaml)")
    parser.add_argument("--window", type=int, default=8, help="steps around gripper transitions")
    parser.add_argument("--execute", type=int, default=8, help="control steps per inference")
    parser.add_argument("--max-episodes", type=int, help="use at most this many episodes")
    args = parser.parse_args(argv)
    base = SchedulerConfig.from_yaml(args.base or config_dir() / "scheduler.yaml")
    kinds = {is_lerobot_dataset(path) for path in args.data}
    missing = [path for path in args.data if not Path(path).exists()]
    if missing:
        parser.error(f"--data: no such path {missing[0]}")
    if len(kinds) > 1:
        parser.error("--data: either eval episodes or LeRobot datasets, not both")
    try:
        if kinds == {True}:
            config, report = calibrate(
                args.data, base, args.window, args.execute, args.max_episodes
            )
        else:
            config, report = calibrate_from_policy(args.data, base)
    except ValueError as exc:
        parser.error(str(exc))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# vla-runtime calibrate scheduler --data {' '.join(args.data)}\n"
    out.write_text(header + config.to_yaml())
    print(json.dumps({"written": str(out), **report, "config": config.to_dict()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(calibrate_main())
