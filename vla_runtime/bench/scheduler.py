"""`vla-runtime bench scheduler`: phase-adaptive compute against always-full compute, closed
loop through the node stack in simulation (`data/evaluate.py`'s lock-step runner: task sim
driver, sim cameras, engine node; here also the scheduler node), same tasks and seeds for both.

Per task: success rate of both arms, mean engine ms per control second (the engine's own
`total_ms` summed over the chunks / simulated seconds run), `speedup` (full / scheduled engine
ms per control second), `success_drop` (full minus scheduled success rate) and the distribution
of the compute modes that actually ran. `overall` pools every task's episodes. Lock-step makes
success independent of host load; the engine ms are measured on this host.
"""

from __future__ import annotations

import os
from pathlib import Path

from vla_runtime.bench.progress import bench_bar
from vla_runtime.core.paths import config_dir, shipped_checkpoint
from vla_runtime.core.scheduler import SchedulerConfig
from vla_runtime.data.evaluate import DEFAULT_EXECUTE, EVAL_SEED, evaluate_stack

FULL_MODE = "v0d0"  # the engine's default: everything recomputed, every denoising step
TARGETS = {"speedup": 2.5, "success_drop": 0.02}


def _arm(checkpoint, task, episodes, seed, execute, progress, scheduled, config_path):
    if scheduled:
        return evaluate_stack(
            checkpoint, task, episodes, seed, execute, progress,
            scheduler={"config": config_path},
        )  # fmt: skip
    return evaluate_stack(
        checkpoint, task, episodes, seed, execute, progress,
        engine_params={"compute_mode": FULL_MODE},
    )  # fmt: skip


def compare(full: dict, scheduled: dict) -> dict:
    """The figures of one task (or the pool) from the two arms' evaluation summaries."""
    cost_full, cost_sched = full["engine_ms_per_control_s"], scheduled["engine_ms_per_control_s"]
    return {
        "episodes": full["episodes"],
        "success_rate_full": full["success_rate"],
        "success_rate_scheduled": scheduled["success_rate"],
        "success_drop": full["success_rate"] - scheduled["success_rate"],
        "engine_ms_per_control_s_full": cost_full,
        "engine_ms_per_control_s_scheduled": cost_sched,
        "speedup": cost_full / cost_sched if cost_sched else None,
        "engine_ms_per_chunk_full": full["engine_ms_per_chunk"],
        "engine_ms_per_chunk_scheduled": scheduled["engine_ms_per_chunk"],
        "modes_scheduled": scheduled["modes"],
        "failed_seeds_full": full["failed_seeds"],
        "failed_seeds_scheduled": scheduled["failed_seeds"],
    }


def _pool(per_task: dict[str, dict]) -> dict:
    """Episode-weighted pool: success rates and ms per control second (weighted by episodes,
    which equals the pooled ratio when episodes run similar lengths)."""
    total = sum(t["episodes"] for t in per_task.values())

    def mean(key):
        return sum(t[key] * t["episodes"] for t in per_task.values()) / total

    full, sched = mean("engine_ms_per_control_s_full"), mean("engine_ms_per_control_s_scheduled")
    return {
        "episodes": total,
        "success_rate_full": mean("success_rate_full"),
        "success_rate_scheduled": mean("success_rate_scheduled"),
        "success_drop": mean("success_rate_full") - mean("success_rate_scheduled"),
        "engine_ms_per_control_s_full": full,
        "engine_ms_per_control_s_scheduled": sched,
        "speedup": full / sched if sched else None,
    }


def run_bench(
    checkpoint: str | None = None,
    tasks: tuple[str, ...] = ("reach", "push", "pick", "dynamic_reach"),
    episodes: int = 50,
    seed: int | None = None,
    execute: int | None = None,
    config: str | None = None,
    progress: bool = True,
) -> dict:
    """Both arms on every task (same seeds); returns per-task figures, the pool and settings.
    `progress`: a bar on stderr over the episodes of both arms on every task, with each arm's
    own evaluation bar beneath it."""
    checkpoint = checkpoint or os.environ.get("VLA_CHECKPOINT") or str(shipped_checkpoint())
    if not Path(checkpoint, "spec.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {checkpoint} (pass --ckpt DIR)")
    seed = EVAL_SEED if seed is None else seed
    execute = DEFAULT_EXECUTE if execute is None else execute
    config_path = str(Path(config or config_dir() / "scheduler.yaml").resolve())
    per_task = {}
    with bench_bar("scheduler", 2 * len(tasks) * episodes, progress, unit="episode") as bar:
        for task in tasks:
            arms = {}
            for arm in ("full", "scheduled"):
                bar.set_postfix_str(f"{task} {arm}")
                arms[arm] = _arm(checkpoint, task, episodes, seed, execute, progress,
                                 arm == "scheduled", config_path)  # fmt: skip
                bar.update(episodes)
            per_task[task] = compare(arms["full"], arms["scheduled"])
    overall = _pool(per_task)
    return {
        "tasks": per_task,
        "overall": overall,
        "targets": TARGETS,
        "met": {
            "speedup": overall["speedup"] is not None and overall["speedup"] >= TARGETS["speedup"],
            "success_drop": all(
                t["success_drop"] <= TARGETS["success_drop"] for t in per_task.values()
            ),
        },
        "settings": {
            "checkpoint": checkpoint,
            "episodes_per_task": episodes,
            "first_seed": seed,
            "execute": execute,
            "full_mode": FULL_MODE,
            "scheduler_config": SchedulerConfig.from_yaml(config_path).to_dict(),
            "config_file": config_path,
            "via": "jtc lock-step node stack (data/evaluate.py)",
        },
    }
