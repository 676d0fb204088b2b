"""The fault bench's picture: per fault, the simulated arm's speed around the onset, with when
the loop reported the fault, when the arm came to rest, and the stop target."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

BEFORE_S, AFTER_S = 0.2, 1.0  # s around the onset that a panel shows


def speed_trace(states, onset: float, reference: float) -> dict:
    """The arm's speed (the fastest joint's |velocity|, rad/s) from `states` (sim time,
    positions, velocities) around `onset`, times in ms since it; `reference`: where the fault's
    stop_ms counts from."""
    rows = [(t, float(np.abs(v).max())) for t, _, v in states
            if onset - BEFORE_S <= t <= onset + AFTER_S]  # fmt: skip
    return {"t_ms": [round(1e3 * (t - onset), 1) for t, _ in rows],
            "speed_rad_s": [round(s, 4) for _, s in rows],
            "reference_ms": round(1e3 * (reference - onset), 1)}  # fmt: skip


def _missed(result: dict) -> bool:
    return any(result["met"].get(k) is False for k in ("detection", "stop"))


def plot_faults(path: Path, results: list[dict], traces: list[dict], stop_target_ms: float,
                rest_speed: float) -> Path:  # fmt: skip
    """One panel per fault (`results` and their `traces` in order): red titles mark a missed
    detection or stop target."""
    cols = 4
    rows = max(1, math.ceil(len(results) / cols))
    fig = Figure(figsize=(3.2 * cols, 2.1 * rows + 0.6))
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, squeeze=False)).ravel()
    for ax, result, trace in zip(axes, results, traces, strict=False):
        ax.plot(trace["t_ms"], trace["speed_rad_s"], lw=1.0, color="tab:blue")
        ax.axhline(rest_speed, color="grey", lw=0.5)
        ax.axvline(0.0, color="black", lw=0.7)
        reference_ms = trace["reference_ms"]
        if result["detection_ms"] is not None:
            ax.axvline(result["detection_ms"], color="tab:orange", lw=1.0)
        if result["stop_ms"] is not None:
            ax.axvline(reference_ms + result["stop_ms"], color="tab:green", lw=1.0)
        if result["met"].get("stop") is not None:
            ax.axvline(reference_ms + stop_target_ms, color="grey", ls="--", lw=0.8)
        detection = result["detection_ms"]
        stop = result["stop_ms"]
        ax.set_title(
            f"{result['fault']}: {'-' if detection is None else f'{detection:g}'} / "
            f"{'-' if stop is None else f'{stop:g}'} ms",
            fontsize=8, color="tab:red" if _missed(result) else "black",
        )  # fmt: skip
        ax.tick_params(labelsize=7)
        ax.set_xlim(-1e3 * BEFORE_S, 1e3 * AFTER_S)
    for ax in axes[len(results) :]:
        ax.set_visible(False)
    marks = [Line2D([], [], color="tab:orange"), Line2D([], [], color="tab:green"),
             Line2D([], [], color="grey", ls="--")]  # fmt: skip
    fig.legend(marks, ["fault reported", "arm at rest", f"stop target ({stop_target_ms:g} ms)"],
               loc="lower center", ncol=3, fontsize=8)  # fmt: skip
    fig.suptitle("arm speed (rad/s, fastest joint) vs ms since the fault's onset; "
                 "title: detection / stop ms", fontsize=9)  # fmt: skip
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=80)
    return path
