"""`vla-runtime bench closed-loop`: what inference delay costs on the product path, per executor.

For each injected extra inference delay (fixed 0, 100, 200, 300 ms and a heavy-tailed one:
lognormal with median 80 ms and 5 % spikes of 400-800 ms; engine parameter `inference_delay`),
on each task, three arms run the same seeds through the full sim stack in real time:

- `async_rtc`: the streamer overlaps inference with execution and drops the stale prefix, the
  engine inpaints the chunk's first actions to follow the remaining plan (real-time chunking,
  the exact vector-Jacobian product through the exported guided-step graph);
- `async`: the same without guidance;
- `sync`: the baseline that waits for each chunk and runs it whole.

Every episode goes through `data/stack_eval.py` (one JSONL per task, delay and arm under
`--out`, so an interrupted run resumes). Pooled over the tasks, per delay and arm:
`async_vs_sync.<delay>.<arm>.{success_rate, time_to_success_s, stale_executed, ...}`; per task
under `by_task`; async_rtc's time to success over sync's per task under `time_to_success_ratio`;
the targets under `met`; a PNG of success and time to success against delay.
"""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.data.evaluate import EVAL_SEED, checkpoint_image_size
from vla_runtime.data.stack_eval import EpisodeRecord, eval_stack, summarise

DELAYS = {
    "0": "0",
    "100": "0.1",
    "200": "0.2",
    "300": "0.3",
    "heavy": "lognormal:0.08:0.05:0.4:0.8",
}
ARMS = {
    "async_rtc": {"stream_mode": "async", "plan_guidance": True},
    "async": {"stream_mode": "async", "plan_guidance": False},
    "sync": {"stream_mode": "sync", "plan_guidance": False},
}
TASKS = ("dynamic_reach", "pick")
KEPT = (
    "success_rate", "stale_executed", "stale_dropped", "executed_actions", "veto_rate",
    "vetoes_by_reason", "retimed_chunks", "hold_s", "inference_rate_hz", "guidance", "episodes",
)  # fmt: skip


def _arm_figures(summary: dict) -> dict:
    return {
        "time_to_success_s": summary["time_to_success_s"]["mean"],
        **{k: summary[k] for k in KEPT},
    }


def run_bench(
    checkpoint: str | None = None,
    tasks: tuple[str, ...] = TASKS,
    episodes: int = 10,
    seed: int = EVAL_SEED,
    out: str = "runs/closed_loop",
    delays: tuple[str, ...] = tuple(DELAYS),
    progress: bool = True,
) -> dict:
    checkpoint = str(Path(checkpoint or shipped_checkpoint()).resolve())
    unknown = [d for d in delays if d not in DELAYS]
    if unknown:
        raise ValueError(f"unknown delays {unknown}; choose from {list(DELAYS)}")
    base = {"checkpoint": checkpoint, "image_size": checkpoint_image_size(checkpoint)}
    directory = Path(out)
    by_task: dict = {}
    pooled: dict = {}
    for delay in delays:
        for arm, settings in ARMS.items():
            records = []
            for task in tasks:
                jsonl = directory / f"{task}_{delay}_{arm}.jsonl"
                overrides = {**base, **settings, "inference_delay": DELAYS[delay]}
                summary = eval_stack(task, episodes, seed, overrides, jsonl, resume=True,
                                     progress=progress)  # fmt: skip
                by_task.setdefault(task, {}).setdefault(delay, {})[arm] = _arm_figures(summary)
                records += [EpisodeRecord(**json.loads(line))
                            for line in jsonl.read_text().splitlines() if line.strip()]  # fmt: skip
            pooled_summary = summarise("+".join(tasks), records, {})
            pooled.setdefault(delay, {})[arm] = _arm_figures(pooled_summary)
    result = {
        "tasks": list(tasks),
        "episodes_per_task": episodes,
        "seed": seed,
        "checkpoint": checkpoint,
        "delays": {d: DELAYS[d] for d in delays},
        "async_vs_sync": pooled,
        "by_task": by_task,
        "time_to_success_ratio": time_to_success_ratios(by_task),
        "met": targets(pooled, by_task),
        "jsonl_dir": str(directory),
    }
    plot = directory / "closed_loop.png"
    plot_sweep(plot, pooled)
    result["plot"] = str(plot)
    return result


def time_to_success_ratios(by_task: dict) -> dict:
    """Per delay and task, async_rtc's mean time to success over sync's (None where either arm
    never succeeded). Compared within a task: pooled means mix tasks in the proportions each arm
    happened to solve them, so an arm that solves more of the quick task looks faster."""
    ratios: dict = {}
    for task, delays in by_task.items():
        for delay, arms in delays.items():
            t_rtc = arms.get("async_rtc", {}).get("time_to_success_s")
            t_sync = arms.get("sync", {}).get("time_to_success_s")
            ratio = t_rtc / t_sync if t_rtc is not None and t_sync else None
            ratios.setdefault(delay, {})[task] = ratio
    return ratios


def targets(pooled: dict, by_task: dict) -> dict:
    """The sweep's targets; a target whose delays were not run is None. Time to success is
    compared task by task (time_to_success_ratios): met when every task both arms solved shows
    async_rtc at most 0.7 x sync, and there is at least one."""
    met: dict = {}

    def arm(delay, name):
        return pooled.get(delay, {}).get(name)

    rtc, sync = arm("200", "async_rtc"), arm("200", "sync")
    if rtc and sync:
        ratios = [r for r in time_to_success_ratios(by_task).get("200", {}).values() if r]
        faster = bool(ratios) and max(ratios) <= 0.7
        met["200ms_async_rtc_time_to_success_le_0.7_sync"] = faster
        met["200ms_async_rtc_success_ge_sync"] = rtc["success_rate"] >= sync["success_rate"]
    else:
        met["200ms_async_rtc_time_to_success_le_0.7_sync"] = None
        met["200ms_async_rtc_success_ge_sync"] = None
    at0, at300 = arm("0", "async_rtc"), arm("300", "async_rtc")
    met["300ms_async_rtc_success_within_0.1_of_0ms"] = (
        abs(at300["success_rate"] - at0["success_rate"]) <= 0.1 if at0 and at300 else None
    )
    heavy = pooled.get("heavy")
    met["heavy_tailed_stale_executed_0"] = (
        all(a["stale_executed"] == 0 for a in heavy.values()) if heavy else None
    )
    return met


def plot_sweep(path: Path, pooled: dict) -> None:
    delays = list(pooled)
    fig = Figure(figsize=(10, 3.6))
    left, right = fig.subplots(1, 2)
    for name in ARMS:
        success = [pooled[d][name]["success_rate"] for d in delays]
        times = [pooled[d][name]["time_to_success_s"] or float("nan") for d in delays]
        left.plot(delays, success, "o-", label=name)
        right.plot(delays, times, "o-", label=name)
    left.set(xlabel="injected inference delay (ms)", ylabel="success rate", ylim=(-0.05, 1.05))
    right.set(xlabel="injected inference delay (ms)", ylabel="mean time to success (s)")
    left.legend(fontsize=8)
    fig.suptitle("closed loop through the full stack, real time")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
