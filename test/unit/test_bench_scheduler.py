"""`bench scheduler`'s figures from the two arms' evaluation summaries, the projection of a
mode mix onto another model's costs, the plot, and its refusals before any episode runs."""

from __future__ import annotations

import pytest

from vla_runtime.bench.scheduler import arm_overrides, compare, plot, projected_cost, run_bench
from vla_runtime.core.paths import shipped_checkpoint


def summary(success_rate, cost, per_chunk, rate, modes, failed=()):
    return {
        "episodes": 50,
        "success_rate": success_rate,
        "engine_ms_per_control_s": cost,
        "engine_ms_per_chunk": per_chunk,
        "inference_rate_hz": rate,
        "modes": modes,
        "veto_rate": 0.0,
        "engine_latency_ms": {"p50": per_chunk, "p99": 2 * per_chunk, "n": 100},
        "failed_seeds": list(failed),
        "incidents": [],
    }


FULL = summary(0.90, 120.0, 30.0, 4.0, {"v0d0": 1.0}, failed=[90003])
SCHEDULED = summary(0.86, 40.0, 9.5, 4.2, {"v1d0": 0.25, "v3d2": 0.75}, failed=[90003, 90007])


def test_compare_takes_speedup_and_success_drop_from_the_two_arms():
    row = compare(FULL, SCHEDULED)
    assert row["speedup"] == pytest.approx(3.0)
    assert row["success_drop"] == pytest.approx(0.04)
    assert row["inference_hz"] == {"full": 4.0, "scheduled": 4.2}
    assert row["modes"]["scheduled"] == {"v1d0": 0.25, "v3d2": 0.75}
    assert row["failed_seeds"]["scheduled"] == [90003, 90007]


def test_compare_has_no_speedup_when_an_arm_ran_no_chunk():
    silent = {**SCHEDULED, "engine_ms_per_control_s": None}
    assert compare(FULL, silent)["speedup"] is None


def test_projection_weights_each_mode_cost_by_its_share_and_the_arm_rate():
    latency = {"v0d0": 3000.0, "v1d0": 2600.0, "v3d2": 400.0}
    assert projected_cost(latency, 4.0, {"v0d0": 1.0}) == pytest.approx(12000.0)
    # 4.2 Hz x (0.25 x 2600 + 0.75 x 400) ms
    assert projected_cost(latency, 4.2, SCHEDULED["modes"]) == pytest.approx(3990.0)
    assert projected_cost(latency, 4.2, {"v4d2": 1.0}) is None  # not timed
    assert projected_cost(latency, None, {"v0d0": 1.0}) is None


def test_plot_writes_a_png_of_every_task_and_the_pool(tmp_path):
    rows = {"reach": compare(FULL, SCHEDULED), "pick": compare(FULL, SCHEDULED)}
    path = plot(tmp_path / "scheduler.png", rows, compare(FULL, SCHEDULED))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_arms_differ_only_in_the_scheduler():
    checkpoint = str(shipped_checkpoint())
    full = arm_overrides(checkpoint, "full", "/x.yaml")
    scheduled = arm_overrides(checkpoint, "scheduled", "/x.yaml")
    assert {k for k in full if full[k] != scheduled[k]} == {"scheduler"}
    assert full["image_size"] == 96 and full["robot"] == "fr3"


def test_a_bad_checkpoint_or_thresholds_file_fails_before_any_episode(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run_bench(checkpoint=str(tmp_path), progress=False)
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler: {refresh_evry: 3}\n")
    with pytest.raises(ValueError, match="unknown scheduler settings"):
        run_bench(config=str(bad), out=str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()
