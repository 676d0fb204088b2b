"""`vla-runtime bench scheduler`: phase-adaptive compute against always-full compute, through
the product path in real time: the stack `vla-runtime eval` runs (`launch sim policy:=true`:
sim cameras, engine, safety, streamer, the simulated arm), with the scheduler node added for
the scheduled arm. Same tasks and seeds for both arms.

Per task and pooled over every task's episodes:
- success rate of both arms and `success_drop` (full minus scheduled);
- `engine_ms_per_control_s` (the engine's own `total_ms` summed over every chunk / the sim
  seconds run) and `speedup` (full / scheduled);
- `inference_hz` (chunks per control second): what a cheaper engine buys in real time, since
  the streamer asks for the next chunk once the plan left covers only the inference delay;
- `modes`: the share of each compute mode that actually ran (the engine's report), and
  `decisions`: the scheduler's tiers and the reasons it gave for not choosing a cheaper one.

`projected_speedup_small` puts the scheduled mix onto a model size that matters: the engine
cost of every mode that ran is timed on the `small` preset (SmolVLA-sized, random weights,
torch, one thread on this CPU), each arm's cost per control second is its inference rate x its
mode mix's mean cost, and the projection is their ratio. Episodes go to `--out` as JSONL (one
file per task and arm; `--resume` skips the seeds already there), next to `scheduler.png`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from matplotlib.figure import Figure

from vla_runtime.bench.engine import time_modes
from vla_runtime.bench.progress import bench_bar
from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode
from vla_runtime.core.paths import config_dir, shipped_checkpoint
from vla_runtime.core.policy_checkpoint import checkpoint_image_size
from vla_runtime.core.scheduler import SchedulerConfig
from vla_runtime.data import stack_eval
from vla_runtime.data.eval_cli import EVAL_SEED
from vla_runtime.engine.checkpoint import load_spec, random_checkpoint
from vla_runtime.engine.torch_backend import TorchPolicy

TASKS = ("reach", "push", "pick", "dynamic_reach")
ARMS = ("full", "scheduled")
TARGETS = {"speedup": 2.5, "success_drop": 0.02}
PROJECTION_ITERATIONS = 3  # timed inferences per mode on the projection's model (after 1 warm)


def arm_overrides(checkpoint: str, arm: str, config_path: str) -> dict:
    """Stack arguments of one arm: what `vla-runtime eval` sets, the scheduler for one arm.
    Without the scheduler the engine runs its default mode, full compute (v0d0)."""
    return {
        "checkpoint": checkpoint,
        "image_size": checkpoint_image_size(checkpoint),
        "robot": load_spec(checkpoint).robot or "fr3",
        "stream_mode": "async",
        "scheduler": arm == "scheduled",
        "scheduler_config": config_path,
    }


def compare(full: dict, scheduled: dict) -> dict:
    """The figures of one task (or the pool) from the two arms' evaluation summaries."""
    cost_full = full.get("engine_ms_per_control_s")
    cost_sched = scheduled.get("engine_ms_per_control_s")
    both = {"full": full, "scheduled": scheduled}
    return {
        "episodes": full["episodes"],
        "success_rate": {arm: s["success_rate"] for arm, s in both.items()},
        "success_drop": full["success_rate"] - scheduled["success_rate"],
        "engine_ms_per_control_s": {"full": cost_full, "scheduled": cost_sched},
        "speedup": cost_full / cost_sched if cost_full and cost_sched else None,
        "engine_ms_per_chunk": {arm: s.get("engine_ms_per_chunk") for arm, s in both.items()},
        "inference_hz": {arm: s.get("inference_rate_hz") for arm, s in both.items()},
        "modes": {arm: s.get("modes", {}) for arm, s in both.items()},
        # the scheduled arm's decisions: the share of each tier and of each reason given
        "decisions": scheduled.get("scheduler"),
        "veto_rate": {arm: s.get("veto_rate") for arm, s in both.items()},
        "engine_latency_ms": {arm: s["engine_latency_ms"] for arm, s in both.items()},
        "failed_seeds": {arm: s["failed_seeds"] for arm, s in both.items()},
        "incidents": {arm: s["incidents"] for arm, s in both.items()},
    }


def projected_cost(latency_ms: dict, inference_hz: float | None, modes: dict) -> float | None:
    """Engine ms per control second of an arm whose mode mix ran on another model: the arm's
    inference rate x the mix's mean cost there. None when a mode that ran was not timed."""
    if not inference_hz or not modes or any(m not in latency_ms for m in modes):
        return None
    return inference_hz * sum(share * latency_ms[m] for m, share in modes.items())


def project(preset: str, overall: dict, progress: bool) -> dict:
    """Time every mode either arm ran on `preset` (torch, one thread) and project both arms'
    cost per control second onto it."""
    tokens = {FULL_COMPUTE.token} | {m for mix in overall["modes"].values() for m in mix}
    modes = [ComputeMode.parse(t) for t in sorted(tokens) if t != "?"]
    checkpoint = random_checkpoint(preset, 0)
    policy = TorchPolicy(checkpoint, device="cpu", seed=0)
    total = len(modes) * (1 + PROJECTION_ITERATIONS)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every engine on this host runs: figures that survive load
    try:
        with bench_bar(f"scheduler ({preset} preset)", total, progress, unit="infer") as bar:
            timed = time_modes({"torch": policy}, checkpoint.spec, modes, PROJECTION_ITERATIONS,
                               1, bar, rss_passes=0)["torch"]  # fmt: skip
    finally:
        torch.set_num_threads(previous_threads)
    latency = {token: t["p50_ms"] for token, t in timed.items()}
    cost = {arm: projected_cost(latency, overall["inference_hz"][arm], overall["modes"][arm])
            for arm in ARMS}  # fmt: skip
    return {
        "preset": preset,
        "backend": "torch (1 thread)",
        "latency_ms_p50": latency,
        "engine_ms_per_control_s": cost,
        "speedup": cost["full"] / cost["scheduled"] if cost["full"] and cost["scheduled"] else None,
    }


def run_bench(
    checkpoint: str | None = None,
    tasks: tuple[str, ...] = TASKS,
    episodes: int = 50,
    seed: int | None = None,
    config: str | None = None,
    out: str = "runs/bench_scheduler",
    resume: bool = False,
    projection_preset: str = "small",
    progress: bool = True,
) -> dict:
    """Both arms on every task (same seeds); returns per-task figures, the pool, the small
    preset's projection and the settings. `progress`: a bar on stderr over every episode of
    both arms, each evaluation's own bar beneath it."""
    checkpoint = checkpoint or os.environ.get("VLA_CHECKPOINT") or str(shipped_checkpoint())
    if not Path(checkpoint, "spec.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {checkpoint} (pass --ckpt DIR)")
    checkpoint = os.path.abspath(checkpoint)
    seed = EVAL_SEED if seed is None else seed
    config_path = str(Path(config or config_dir() / "scheduler.yaml").resolve())
    thresholds = SchedulerConfig.from_yaml(config_path)  # a bad file fails before any episode
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    per_task, pooled = {}, {arm: [] for arm in ARMS}
    with bench_bar("scheduler", len(ARMS) * len(tasks) * episodes, progress, unit="episode") as bar:
        for task in tasks:
            arms = {}
            for arm in ARMS:
                bar.set_postfix_str(f"{task} {arm}")
                jsonl = folder / f"{task}_{arm}.jsonl"
                arms[arm] = stack_eval.eval_stack(
                    task, episodes, seed, arm_overrides(checkpoint, arm, config_path), jsonl,
                    resume, progress,
                )  # fmt: skip
                pooled[arm] += [r for r in stack_eval.read_episodes(jsonl)
                                if seed <= r.seed < seed + episodes]  # fmt: skip
                bar.update(episodes)
            per_task[task] = compare(arms["full"], arms["scheduled"])
    overall = compare(*(stack_eval.summarise("all", pooled[arm], {}) for arm in ARMS))
    projection = project(projection_preset, overall, progress) if projection_preset else None
    result = {
        "tasks": per_task,
        "overall": overall,
        "speedup": overall["speedup"],
        "success_drop": overall["success_drop"],
        "inference_hz": overall["inference_hz"],
        "modes": overall["modes"],
        f"projected_speedup_{projection_preset}": projection and projection["speedup"],
        "projection": projection,
        "targets": TARGETS,
        "met": {
            "speedup": overall["speedup"] is not None and overall["speedup"] >= TARGETS["speedup"],
            "success_drop": all(
                t["success_drop"] <= TARGETS["success_drop"] for t in (*per_task.values(), overall)
            ),
        },
        "settings": {
            "checkpoint": checkpoint,
            "episodes_per_task": episodes,
            "first_seed": seed,
            "full_mode": FULL_COMPUTE.token,
            "scheduler_config": thresholds.to_dict(),
            "config_file": config_path,
            "via": "stack (the product path in real time, as `vla-runtime eval` runs it)",
            "episodes_jsonl": str(folder),
        },
    }
    result["plot"] = str(plot(folder / "scheduler.png", per_task, overall))
    return result


def plot(path: Path, per_task: dict, overall: dict) -> Path:
    """Per task and overall: engine ms per control second and success rate of both arms, and
    the scheduled arm's mode mix."""
    rows = {**per_task, "overall": overall}
    names = list(rows)
    fig = Figure(figsize=(4 + 1.6 * len(names), 8))
    cost_ax, success_ax, mix_ax = fig.subplots(3, 1)
    width = 0.38
    for k, arm in enumerate(ARMS):
        xs = [i + (k - 0.5) * width for i in range(len(names))]
        cost_ax.bar(xs, [rows[n]["engine_ms_per_control_s"][arm] or 0 for n in names], width,
                    label=arm)  # fmt: skip
        success_ax.bar(xs, [rows[n]["success_rate"][arm] or 0 for n in names], width, label=arm)
    for n_index, name in enumerate(names):
        speedup = rows[name]["speedup"]
        if speedup:
            cost_ax.annotate(f"{speedup:.2f}x", (n_index, 0), ha="center", va="bottom",
                             fontsize=8)  # fmt: skip
    cost_ax.set_ylabel("engine ms per\ncontrol second")
    success_ax.set_ylabel("success rate")
    success_ax.set_ylim(0, 1.05)
    tokens = sorted({m for name in names for m in rows[name]["modes"]["scheduled"]})
    bottom = [0.0] * len(names)
    for token in tokens:
        shares = [rows[name]["modes"]["scheduled"].get(token, 0.0) for name in names]
        mix_ax.bar(range(len(names)), shares, 0.6, bottom=bottom, label=token)
        bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
    mix_ax.set_ylabel("scheduled arm:\nshare of modes run")
    for ax in (cost_ax, success_ax, mix_ax):
        ax.set_xticks(range(len(names)), names)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path
