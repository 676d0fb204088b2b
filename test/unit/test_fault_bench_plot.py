"""The fault bench's plot: the arm's speed around each fault's onset."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.bench.faults import run_bench
from vla_runtime.bench.faults_plot import AFTER_S, BEFORE_S, plot_faults, speed_trace


def states(onset: float):
    """100 Hz joint states: joint 2 at 0.3 rad/s until the onset, braking to rest in 0.1 s."""
    rows = []
    for k in range(300):
        t = k * 0.01
        speed = 0.3 if t < onset else max(0.3 - 3.0 * (t - onset), 0.0)
        rows.append((t, np.zeros(3), np.array([0.01, -speed, 0.0])))
    return rows


def test_the_trace_is_the_fastest_joints_speed_around_the_onset_in_ms():
    trace = speed_trace(states(1.0), onset=1.0, reference=0.95)
    assert trace["t_ms"][0] == -1e3 * BEFORE_S and trace["t_ms"][-1] == 1e3 * AFTER_S
    at = dict(zip(trace["t_ms"], trace["speed_rad_s"], strict=True))
    assert at[-100.0] == 0.3 and at[50.0] == 0.15 and at[200.0] == 0.01  # joint 1 idles at 0.01
    assert trace["reference_ms"] == -50.0


def test_the_plot_draws_every_fault_even_without_a_detection_or_a_stop(tmp_path):
    results = [
        {"fault": "drop_all", "detection_ms": 60.0, "stop_ms": 160.0,
         "met": {"detection": True, "stop": True}},
        {"fault": "hang_engine", "detection_ms": 120.0, "stop_ms": 340.0,
         "met": {"detection": False, "stop": False}},
        {"fault": "kill_driver", "detection_ms": None, "stop_ms": None,
         "met": {"detection": None, "stop": None}},
    ]  # fmt: skip
    traces = [speed_trace(states(1.0), 1.0, 1.0) for _ in results]
    path = plot_faults(tmp_path / "faults.png", results, traces, 300.0, 0.02)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_an_unwritable_plot_path_fails_before_the_bench_starts(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        run_bench(faults=("baseline",), progress=False, plot_path=blocker / "faults.png")
