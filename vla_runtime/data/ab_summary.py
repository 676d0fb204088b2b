"""Figures, differences, verdict and report of an A/B run, from its episode log.

Everything here is derived from OUT/episodes.jsonl, so a reviewer can re-derive every number.
The report (OUT/report.html) embeds its plots, so the one file can be mailed or attached:
latency histograms and CDFs per arm, success with Wilson intervals, time-to-success
distributions and the per-episode timeline.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from vla_runtime.core.ab_plan import ARMS, completed_pairs, spec_text
from vla_runtime.core.ab_stats import (
    PairedSprt,
    bootstrap_median_difference,
    mann_whitney_p,
    mcnemar_exact_p,
    newcombe_difference,
)
from vla_runtime.core.stats import wilson_interval
from vla_runtime.data.stack_eval import EpisodeRecord, summarise

ARM_COLOURS = {"a": "tab:blue", "b": "tab:orange"}
AB_FIELDS = ("arm", "jerk_rms")  # what a log line adds to an episode record
TABLE_ROWS = {  # per-arm figure -> its row in the report
    "success_rate": "success rate",
    "time_to_success_s": "time to success p50 (s)",
    "jerk_rms": "RMS jerk p50 (rad/s³)",
    "handover_jump_rad_p99": "chunk hand-over jump p99, episode median (rad)",
    "veto_rate": "veto rate",
    "stale_dropped": "stale actions dropped",
}


def _percentile(values, q):
    return float(np.percentile(values, q)) if len(values) else None


def _arm_figures(entries: list[dict]) -> dict:
    """An arm's figures: the evaluation summary of its episodes (stack_eval.summarise), the
    success rate's interval, and the smoothness figures only an A/B run records."""
    records = [EpisodeRecord(**{k: v for k, v in e.items() if k not in AB_FIELDS}) for e in entries]
    figures = summarise("", records, {})
    n, successes = figures["episodes"], figures["successes"]
    jerk = [e["jerk_rms"] for e in entries if e.get("jerk_rms") is not None]
    handover = [float(e["streamer"]["handover_jump_p99"]) for e in entries
                if e.get("streamer", {}).get("handover_jump_p99") not in (None, "")]  # fmt: skip
    return {
        "episodes": n,
        "successes": successes,
        "success_rate": figures["success_rate"],
        "success_ci": list(wilson_interval(successes, n)) if n else [None, None],
        "latency_ms": figures["engine_latency_ms"],
        "time_to_success_s": figures["time_to_success_s"]["p50"],
        "time_to_success_mean_s": figures["time_to_success_s"]["mean"],
        "jerk_rms": _percentile(jerk, 50),
        "handover_jump_rad_p99": _percentile(handover, 50),
        "veto_rate": figures["veto_rate"],
        "stale_dropped": figures["stale_dropped"],
        "stale_executed": figures["stale_executed"],
        "incidents": len(figures["incidents"]),
    }


def _continuous(a, b) -> dict:
    interval = bootstrap_median_difference(a, b)
    if interval is None:
        return {"estimate": None, "ci_low": None, "ci_high": None, "mann_whitney_p": None}
    estimate, low, high = interval
    return {"estimate": estimate, "ci_low": low, "ci_high": high,
            "mann_whitney_p": mann_whitney_p(a, b)}  # fmt: skip


def summarise_ab(entries, plan, settings, sprt, stopped_early, out: Path) -> dict:
    by_arm = {arm: [e for e in entries if e["arm"] == arm] for arm in ARMS}
    arms = {arm: _arm_figures(by_arm[arm]) for arm in ARMS}
    done = {(e["seed"], e["arm"]) for e in entries}
    outcome = {(e["seed"], e["arm"]): e["success"] for e in entries}
    pairs = completed_pairs(done, plan)
    a_only = sum(outcome[s, "a"] and not outcome[s, "b"] for s in pairs)
    b_only = sum(outcome[s, "b"] and not outcome[s, "a"] for s in pairs)
    success = {"estimate": None, "ci_low": None, "ci_high": None}
    if arms["a"]["episodes"] and arms["b"]["episodes"]:
        estimate, low, high = newcombe_difference(
            arms["a"]["successes"], arms["a"]["episodes"],
            arms["b"]["successes"], arms["b"]["episodes"],
        )  # fmt: skip
        success = {"estimate": estimate, "ci_low": low, "ci_high": high}
    success.update(mcnemar_p=mcnemar_exact_p(a_only, b_only), pairs=len(pairs),
                   a_only=a_only, b_only=b_only)  # fmt: skip

    def samples(arm, key):
        if key == "engine_infer_ms":
            return [x for e in by_arm[arm] for x in e[key]]
        return [e[key] for e in by_arm[arm] if e.get(key) is not None and
                (key != "time_to_success_s" or e["success"])]  # fmt: skip

    difference = {"success": success}
    for name, key in (("latency_ms", "engine_infer_ms"), ("time_to_success_s", "time_to_success_s"),
                      ("jerk_rms", "jerk_rms")):  # fmt: skip
        difference[name] = _continuous(samples("a", key), samples("b", key))
    test = PairedSprt(sprt.effect, sprt.alpha, sprt.beta) if sprt else PairedSprt()
    for s in pairs:
        test.add(outcome[s, "a"], outcome[s, "b"])
    summary = {
        "arms": arms,
        "difference": difference,
        "sequential": {
            "decision": test.decision,
            "effect": test.effect,
            "alpha": test.alpha,
            "beta": test.beta,
            "applied": sprt is not None,
        },  # fmt: skip
        "stopped_early": stopped_early,
        "settings": settings,
        "log": str(out / "episodes.jsonl"),
    }
    summary["verdict"] = verdict(summary)
    summary["report"] = str(write_report(out, summary, entries))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def verdict(summary: dict) -> str:
    """One sentence: latency difference and whether it costs success, with the intervals."""
    names = {arm: f"{arm.upper()} ({spec_text(summary['settings'][arm])})" for arm in ARMS}
    latency, success = summary["difference"]["latency_ms"], summary["difference"]["success"]
    if latency["estimate"] is None:
        speed = "latency could not be compared (no inference on one arm)"
    elif latency["ci_low"] > 0 or latency["ci_high"] < 0:
        # The difference is A - B: positive means B is faster.
        faster, sign = ("b", 1) if latency["estimate"] > 0 else ("a", -1)
        low, high = sorted((sign * latency["ci_low"], sign * latency["ci_high"]))
        speed = (
            f"{names[faster]} is faster by {sign * latency['estimate']:.1f} ms at the "
            f"engine median (95% CI {low:.1f}-{high:.1f})"
        )
    else:
        speed = (f"no latency difference is detectable ({latency['estimate']:+.1f} ms, 95% CI "
                 f"{latency['ci_low']:+.1f} to {latency['ci_high']:+.1f})")  # fmt: skip
    if success["estimate"] is None:
        return speed + "; success could not be compared"
    rates = f"success A {summary['arms']['a']['success_rate']:.2f} vs B " \
            f"{summary['arms']['b']['success_rate']:.2f}"  # fmt: skip
    interval = f"difference {success['estimate']:+.2f}, 95% CI {success['ci_low']:+.2f} to " \
               f"{success['ci_high']:+.2f}, McNemar p {success['mcnemar_p']:.2g}"  # fmt: skip
    if success["ci_low"] > 0 or success["ci_high"] < 0:
        better = "A" if success["estimate"] > 0 else "B"
        cost = f"{better} succeeds more often ({rates}; {interval})"
    else:
        cost = f"no success difference is detectable ({rates}; {interval})"
    return f"{speed}; {cost}."


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    return base64.b64encode(buffer.getvalue()).decode()


def _plots(summary: dict, entries: list[dict]) -> dict[str, Figure]:
    by_arm = {arm: [e for e in entries if e["arm"] == arm] for arm in ARMS}
    label = {arm: f"{arm.upper()}: {spec_text(summary['settings'][arm])}" for arm in ARMS}
    latency = Figure(figsize=(11, 3.8))
    hist, cdf = latency.subplots(1, 2)
    for arm in ARMS:
        values = np.sort([x for e in by_arm[arm] for x in e["engine_infer_ms"]])
        if values.size:
            hist.hist(values, bins=40, alpha=0.6, color=ARM_COLOURS[arm], label=label[arm])
            cdf.plot(values, np.arange(1, values.size + 1) / values.size, color=ARM_COLOURS[arm],
                     label=label[arm])  # fmt: skip
    hist.set_title("engine inference latency", fontsize=9)
    cdf.set_title("latency CDF", fontsize=9)
    for ax in (hist, cdf):
        ax.set_xlabel("ms", fontsize=8)
        ax.legend(fontsize=7)
    outcomes = Figure(figsize=(11, 3.8))
    rate_ax, time_ax = outcomes.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    for k, arm in enumerate(ARMS):
        figures = summary["arms"][arm]
        if figures["episodes"]:
            rate, (low, high) = figures["success_rate"], figures["success_ci"]
            rate_ax.bar([k], [rate], color=ARM_COLOURS[arm], width=0.6)
            rate_ax.errorbar([k], [rate], yerr=[[rate - low], [high - rate]], color="k",
                             capsize=8)  # fmt: skip
        times = [e["time_to_success_s"] for e in by_arm[arm] if e["success"]]
        if times:
            time_ax.hist(times, bins=15, alpha=0.6, color=ARM_COLOURS[arm], label=label[arm])
    rate_ax.set_xticks([0, 1], ["A", "B"])
    rate_ax.set_ylim(0, 1.05)
    rate_ax.set_title("success rate (95% Wilson CI)", fontsize=9)
    time_ax.set_title("time to success", fontsize=9)
    time_ax.set_xlabel("s (sim time)", fontsize=8)
    time_ax.legend(fontsize=7)
    timeline = Figure(figsize=(11, 3.2))
    ax = timeline.subplots()
    for i, e in enumerate(entries):
        y = e["time_to_success_s"] if e["success"] else e["sim_s"]
        ax.plot(i, y, "o" if e["success"] else "x", color=ARM_COLOURS[e["arm"]], ms=6)
    ax.set_title("episodes in run order (o: success at its time, x: failure at its end; "
                 "blue A, orange B)", fontsize=9)  # fmt: skip
    ax.set_xlabel("episode", fontsize=8)
    ax.set_ylabel("s", fontsize=8)
    return {"latency": latency, "outcomes": outcomes, "timeline": timeline}


def write_report(out: Path, summary: dict, entries: list[dict]) -> Path:
    """OUT/report.html with the plots embedded, and each plot as OUT/NAME.png too; `entries`
    in run order."""
    images = {}
    for name, fig in _plots(summary, entries).items():
        images[name] = _png(fig)
        (out / f"{name}.png").write_bytes(base64.b64decode(images[name]))
    rows = []
    for key, title in TABLE_ROWS.items():
        cells = "".join(f"<td>{_fmt(summary['arms'][arm][key])}</td>" for arm in ARMS)
        rows.append(f"<tr><th>{title}</th>{cells}</tr>")
    cells = "".join(
        f"<td>{_fmt(summary['arms'][arm]['latency_ms']['p50'])} / "
        f"{_fmt(summary['arms'][arm]['latency_ms']['p99'])}</td>"
        for arm in ARMS
    )
    rows.insert(1, f"<tr><th>engine latency p50 / p99 (ms)</th>{cells}</tr>")
    head = "".join(f"<th>{arm.upper()}: {html.escape(spec_text(summary['settings'][arm]))}</th>"
                   for arm in ARMS)  # fmt: skip
    body = "".join(f'<img alt="{name}" src="data:image/png;base64,{data}">'
                   for name, data in images.items())  # fmt: skip
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>vla-runtime ab: {html.escape(summary["settings"]["task"])}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:0.2em 1em;text-align:left}}
img{{max-width:100%;display:block;margin:1em 0}}</style></head>
<body><h1>A/B: {html.escape(summary["settings"]["task"])}</h1>
<p><b>{html.escape(summary["verdict"])}</b></p>
<table><tr><th></th>{head}</tr>{"".join(rows)}</table>
<p>stopped early: {summary["stopped_early"]}; sequential decision:
{html.escape(str(summary["sequential"]["decision"]))}; log: {html.escape(summary["log"])}</p>
{body}
</body></html>
"""  # noqa: E501
    path = out / "report.html"
    path.write_text(page)
    return path


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
