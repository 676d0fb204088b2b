"""The fault bench's closed loop (sim driver, cameras, engine, fault injector, safety, streamer as
processes) under a short list of faults: nothing unsafe reaches the driver, every chunk that
reached the safety node has a verdict, and the arm stops in time where the commands go silent.
The full list runs in `vla-runtime bench faults --json`."""

from __future__ import annotations

import pytest

from vla_runtime.bench.faults import QUICK_FAULTS, run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_quick_faults_in_the_closed_sim_loop():  # the bench claims its own ROS domain
    result = run_bench(faults=QUICK_FAULTS, observe_s=2.0, progress=False)
    faults = {r["fault"]: r for r in result["faults"]}
    assert list(faults) == list(QUICK_FAULTS)
    assert result["unsafe_commands"] == 0, result
    assert all(r["unsafe_at"] == [] for r in result["faults"]), result
    assert result["chunks_unaccounted"] == 0, result
    assert result["nodes_dead_at_end"] == [], result["dead_nodes_output"]
    for name in ("kill_streamer", "kill_safety"):
        assert faults[name]["stopped_in_time"], faults[name]
    assert faults["kill_streamer"]["reaction"] == "command_timeout"
    assert faults["drop_3"]["chunks_withheld"] == 3
    assert faults["delay_1000ms"]["verdicts"].get("stale", 0) >= 1
    assert faults["kill_safety"]["recovered_s"] is not None


WATCHED_FAULTS = ("frozen_fresh_stamps", "hang_engine", "nan_policy", "estop", "drop_commands")


def test_watched_faults_are_detected_and_stop_nothing_unsafe():
    result = run_bench(faults=WATCHED_FAULTS, observe_s=1.5, progress=False)
    faults = {r["fault"]: r for r in result["faults"]}
    assert list(faults) == list(WATCHED_FAULTS)
    assert result["unsafe_commands"] == 0, result
    assert result["chunks_unaccounted"] == 0, result
    assert faults["frozen_fresh_stamps"]["detection_ms"] is not None, result
    assert faults["hang_engine"]["detection_ms"] is not None, result
    assert faults["nan_policy"]["detection_ms"] is not None, result  # the engine drops NaN
    assert faults["estop"]["reaction"] == "estop", result
    assert faults["estop"]["operator"]["success"], faults["estop"]
    assert faults["drop_commands"]["reaction"] == "command_timeout", result
    for name in WATCHED_FAULTS:
        assert faults[name]["recovered_s"] is not None, faults[name]
