"""The picture of an `eval` run (`--report DIR`): PNG plots and a small HTML page beside the JSON.

- `latency.png`: histograms of each link of the latency chain (camera frame age, engine
  inference, capture to chunk, safety check) with their p50 and p99;
- `outcomes.png`: success rate with its 95 % Wilson interval, time-to-success distribution,
  and per-episode chunk verdicts;
- `joints.png`: commanded vs measured joints with the verdict timeline (when recorded);
- `summary.json` and `index.html`, which shows the figures above and links the per-episode log.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from vla_runtime.core.stats import wilson_interval
from vla_runtime.data.stack_plot import VERDICT_COLOURS

LATENCY_LINKS = {  # record field -> label
    "camera_age_ms": "camera frame age",
    "engine_infer_ms": "engine inference",
    "capture_to_chunk_ms": "capture to chunk",
    "check_ms": "safety check",
}
OUTCOME_COLOURS = {"success": "tab:green", "timeout": "tab:orange"}


def success_interval(summary: dict) -> tuple[float, float] | None:
    n = summary["episodes"]
    return wilson_interval(summary["successes"], n) if n else None


def plot_latency(path: Path, records: list) -> None:
    fig = Figure(figsize=(10, 6))
    for ax, (field, label) in zip(fig.subplots(2, 2).flat, LATENCY_LINKS.items(), strict=True):
        values = np.array([x for r in records for x in getattr(r, field)], dtype=float)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("ms", fontsize=8)
        if values.size == 0:
            ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes)
            continue
        ax.hist(values, bins=min(40, max(5, values.size // 4)), color="tab:blue", alpha=0.8)
        for q, style in ((50, "-"), (99, "--")):
            v = float(np.percentile(values, q))
            ax.axvline(v, color="k", ls=style, lw=1, label=f"p{q} {v:.0f} ms")
        ax.legend(fontsize=7)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"latency chain over {len(records)} episodes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_outcomes(path: Path, summary: dict, records: list) -> None:
    fig = Figure(figsize=(12, 3.8))
    rate_ax, time_ax, verdict_ax = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 2, 3]})
    interval = success_interval(summary)
    if interval is not None:
        rate = summary["success_rate"]
        rate_ax.bar([0], [rate], color="tab:green", width=0.5)
        rate_ax.errorbar([0], [rate], yerr=[[rate - interval[0]], [interval[1] - rate]],
                         color="k", capsize=8)  # fmt: skip
        rate_ax.set_title(f"success {summary['successes']}/{summary['episodes']}\n"
                          f"95% CI {interval[0]:.2f}-{interval[1]:.2f}", fontsize=9)  # fmt: skip
    rate_ax.set_ylim(0, 1.05)
    rate_ax.set_xticks([])
    times = [r.time_to_success_s for r in records if r.success]
    if times:
        time_ax.hist(times, bins=min(20, max(3, len(times) // 2)), color="tab:green", alpha=0.8)
    time_ax.set_title("time to success", fontsize=9)
    time_ax.set_xlabel("s (sim time)", fontsize=8)
    seeds = [str(r.seed) for r in records]
    bottom = np.zeros(len(records))
    for verdict, colour in VERDICT_COLOURS.items():
        counts = np.array([r.verdicts.get(verdict, 0) for r in records], dtype=float)
        verdict_ax.bar(seeds, counts, bottom=bottom, color=colour, label=verdict)
        bottom += counts
    for tick, r in zip(verdict_ax.get_xticklabels(), records, strict=True):
        tick.set_color(OUTCOME_COLOURS.get(r.outcome, "tab:red"))
    verdict_ax.set_title("chunk verdicts per episode (seed colour: outcome)", fontsize=9)
    verdict_ax.tick_params(axis="x", labelrotation=90, labelsize=6)
    verdict_ax.legend(fontsize=7, ncols=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _figures(summary: dict) -> list[tuple[str, str]]:
    engine, times = summary["engine_latency_ms"], summary["time_to_success_s"]
    interval = success_interval(summary)

    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    def pair(entry, a, b, fmt):
        return f"{num(entry[a], fmt)} / {num(entry[b], fmt)}"

    return [
        ("task", summary["task"]),
        ("episodes", str(summary["episodes"])),
        ("success rate (95% Wilson CI)",
         f"{num(summary['success_rate'], '.2f')}"
         + (f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else "")),
        ("time to success p50 / p95 (s)", pair(times, "p50", "p95", ".2f")),
        ("veto rate", num(summary["veto_rate"], ".3f")),
        ("stale actions executed", str(summary["stale_executed"])),
        ("engine inference p50 / p99 (ms)", pair(engine, "p50", "p99", ".0f")),
        ("inference rate (Hz)", num(summary["inference_rate_hz"], ".1f")),
        ("stack", f"{summary.get('backend')} back end, {summary.get('mode')} streamer"),
    ]  # fmt: skip


def write_eval_report(out: Path, summary: dict, records: list, headline: str) -> Path:
    """Write the plots, summary.json and index.html into `out`; returns the page's path.
    `summary["plot"]`, when present, is the joints plot, shown on the page too."""
    out.mkdir(parents=True, exist_ok=True)
    plot_latency(out / "latency.png", records)
    plot_outcomes(out / "outcomes.png", summary, records)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    images = ["outcomes.png", "latency.png"]
    if summary.get("plot") and Path(summary["plot"]).exists():
        joints = Path(summary["plot"]).resolve()
        images.append(joints.name if joints.parent == out.resolve() else joints.as_uri())
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                     for k, v in _figures(summary))  # fmt: skip
    links = '<a href="summary.json">summary.json</a>'
    if summary.get("jsonl"):
        links += f' · <a href="{Path(summary["jsonl"]).resolve().as_uri()}">per-episode log</a>'
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>vla-runtime eval: {html.escape(summary["task"])}</title>
<style>body{{font-family:sans-serif;margin:2em}}th{{text-align:left;padding-right:2em}}
img{{max-width:100%;display:block;margin:1em 0}}</style></head>
<body><h1>vla-runtime eval: {html.escape(summary["task"])}</h1>
<p>{html.escape(headline)}</p>
<table>{rows}</table>
<p>{links}</p>
{"".join(f'<img src="{src}" alt="{Path(src).stem}">' for src in images)}
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return index
