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
under `by_task`; async_rtc's time to success over sync's per task, on the seeds both solved,
under `time_to_success_ratio`; the targets under `met`; a PNG of success and time to success
against delay.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from vla_runtime.bench.progress import bench_bar
from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.core.policy_checkpoint import checkpoint_image_size
from vla_runtime.data.evaluate import EVAL_SEED
from vla_runtime.data.stack_eval import eval_stack, read_episodes, summarise

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
    """`progress`: one bar on stderr over every episode (delays × arms × tasks), in place of
    `eval_stack`'s bar per task."""
    checkpoint = str(Path(checkpoint or shipped_checkpoint()).resolve())
    unknown = [d for d in delays if d not in DELAYS]
    if unknown:
        raise ValueError(f"unknown delays {unknown}; choose from {list(DELAYS)}")
    base = {"checkpoint": checkpoint, "image_size": checkpoint_image_size(checkpoint)}
    directory = Path(out)
    by_task: dict = {}
    pooled: dict = {}
    solved: dict = {}  # (task, delay, arm) -> {seed: time to success}
    total = len(delays) * len(ARMS) * len(tasks) * episodes
    with bench_bar("closed-loop", total, progress, unit="episode") as bar:
        for delay in delays:
            for arm, settings in ARMS.items():
                records = []
                for task in tasks:
                    jsonl = directory / f"{task}_{delay}_{arm}.jsonl"
                    overrides = {**base, **settings, "inference_delay": DELAYS[delay]}
                    bar.set_postfix_str(f"{delay} ms {arm} {task}")
                    done = bar.n
                    summary = eval_stack(
                        task, episodes, seed, overrides, jsonl, resume=True, progress=False,
                        printer=lambda _: bar.update(1),
                    )  # fmt: skip
                    bar.update(done + episodes - bar.n)  # episodes resumed from the JSONL
                    by_task.setdefault(task, {}).setdefault(delay, {})[arm] = _arm_figures(summary)
                    episodes_run = read_episodes(jsonl)
                    solved[task, delay, arm] = {
                        r.seed: r.time_to_success_s for r in episodes_run if r.success
                    }
                    records += episodes_run
                pooled_summary = summarise("+".join(tasks), records, {})
                pooled.setdefault(delay, {})[arm] = _arm_figures(pooled_summary)
    ratios = time_to_success_ratios(solved)
    result = {
        "tasks": list(tasks),
        "episodes_per_task": episodes,
        "seed": seed,
        "checkpoint": checkpoint,
        "delays": {d: DELAYS[d] for d in delays},
        "async_vs_sync": pooled,
        "by_task": by_task,
        "time_to_success_ratio": ratios,
        "met": targets(pooled, ratios),
        "jsonl_dir": str(directory),
    }
    plot = directory / "closed_loop.png"
    plot_sweep(plot, pooled)
    result["plot"] = str(plot)
    return result


def time_to_success_ratios(solved: dict) -> dict:
    """Per delay and task, async_rtc's time to success over sync's on the seeds both solved
    (`solved`: (task, delay, arm) -> {seed: time}): {ratio, paired_episodes}, ratio None without
    a pair. Paired by seed and within a task, because pooled means mix tasks and seeds in the
    proportions each arm happened to solve them: an arm that solves more of the quick cases
    looks faster."""
    ratios: dict = {}
    for (task, delay, arm), times in solved.items():
        if arm != "async_rtc":
            continue
        sync = solved.get((task, delay, "sync"), {})
        paired = [seed for seed in times if seed in sync]
        ratio = None
        if paired:
            ratio = sum(times[s] for s in paired) / sum(sync[s] for s in paired)
        ratios.setdefault(delay, {})[task] = {"ratio": ratio, "paired_episodes": len(paired)}
    return ratios


def targets(pooled: dict, ratios: dict) -> dict:
    """The sweep's targets; a target whose delays were not run is None. Time to success is
    compared per task on the seeds both arms solved (`ratios`, from time_to_success_ratios): met
    when every task with such seeds shows async_rtc at most 0.7 x sync, and there is one."""
    met: dict = {}

    def arm(delay, name):
        return pooled.get(delay, {}).get(name)

    rtc, sync = arm("200", "async_rtc"), arm("200", "sync")
    if rtc and sync:
        at200 = [r["ratio"] for r in ratios.get("200", {}).values() if r["ratio"] is not None]
        faster = bool(at200) and max(at200) <= 0.7
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
