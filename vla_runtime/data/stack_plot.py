"""Commanded vs measured joints of a product-path run, with the safety verdict timeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

VERDICT_COLOURS = {"accept": "tab:green", "clip": "tab:olive", "veto": "tab:red", "stale": "grey"}


def plot_run(path: Path, joints, motion, chunk_events, marks) -> None:
    """`motion`: ("state" | "command", t, arm positions); `chunk_events`: the safety node's
    chunk verdicts; `marks`: (seed, EpisodeRecord, start stamp) per episode."""
    n = len(joints)
    fig = Figure(figsize=(11, 1.4 * (n + 1) + 1))
    axes = fig.subplots(n + 1, 1, sharex=True)
    series = {}
    for kind in ("state", "command"):
        rows = [(t, q) for k, t, q in motion if k == kind]
        if rows:
            series[kind] = (np.array([t for t, _ in rows]), np.array([q for _, q in rows]))
    for j, ax in enumerate(axes[:n]):
        for kind, style in (("command", "-"), ("state", "--")):
            if kind in series:
                t, q = series[kind]
                label = "commanded" if kind == "command" else "measured"
                ax.plot(t, q[:, j], style, lw=1.0, label=label)
        ax.set_ylabel(joints[j].replace("_joint", "\nj"), fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0].legend(loc="upper right", fontsize=7)
    timeline = axes[n]
    for event in chunk_events:
        verdict = event.get("verdict", "?")
        colour = VERDICT_COLOURS.get(verdict, "black")
        timeline.plot(float(event["stamp"]), list(VERDICT_COLOURS).index(verdict)
                      if verdict in VERDICT_COLOURS else -1, "|", color=colour, ms=12)  # fmt: skip
    timeline.set_yticks(range(len(VERDICT_COLOURS)), list(VERDICT_COLOURS), fontsize=7)
    timeline.set_ylim(-0.7, len(VERDICT_COLOURS) - 0.3)
    timeline.set_xlabel("sim time (s)")
    for seed, record, start in marks:
        for ax in axes:
            ax.axvline(start, color="k", lw=0.6, alpha=0.5)
        result = f"success {record.time_to_success_s:.1f} s" if record.success else record.outcome
        axes[0].text(start, 1.02, f"seed {seed}: {result}", transform=axes[0].get_xaxis_transform(),
                     fontsize=7)  # fmt: skip
    fig.suptitle("commanded vs measured joints and chunk verdicts (product path, real time)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
