"""`vla-runtime bench safety`: its full-physics ground truth, and a short run's JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from vla_runtime.bench import safety
from vla_runtime.core.kinematics import chain_for
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.workspace import keep_out_boxes

ROBOT = load_robot("fr3")


@pytest.fixture(scope="module")
def scene():
    sim = safety.TaskSimulator("reach", 3)
    physics = safety.Physics(sim.model, ROBOT.tcp_speed, keep_out_boxes(safety.KEEP_OUT)[0])
    return sim, physics, safety.HazardMaker(sim, physics, 5)


def test_ground_truth_tells_a_still_arm_from_one_driven_into_the_table(scene):
    sim, physics, maker = scene
    hold = np.tile([*ROBOT.home, 0.03], (16, 1))
    times = safety.DT * np.arange(1, 17)
    still = physics.execute(sim.qpos, np.zeros(7), times, hold)
    assert still.hazards == set() and still.numbers["max_tcp_speed"] < 0.01
    case = maker.make("table_contact", 11)
    assert case is not None
    chain = chain_for("fr3")
    assert chain.tcp_position(case.positions[-1, :7])[2] < -0.005  # planned below the top
    down = physics.execute(case.qpos, case.dq, case.times, case.positions)
    assert "table_contact" in down.hazards and down.numbers["max_table_n"] > safety.TOUCH_N


def test_ground_truth_measures_tcp_speed_in_the_physics(scene):
    _, physics, maker = scene
    case = maker.make("tcp_speed", 2)
    assert case is not None
    planned = chain_for("fr3").tcp_position(case.positions[:, :7])
    chord = np.linalg.norm(np.diff(planned, axis=0), axis=1).max() / safety.DT
    outcome = physics.execute(case.qpos, case.dq, case.times, case.positions)
    assert chord > ROBOT.tcp_speed and "tcp_speed" in outcome.hazards
    assert outcome.numbers["max_tcp_speed"] == pytest.approx(chord, rel=0.1)


def test_quick_run_prints_one_json_object_with_the_figures():
    out = subprocess.run(
        [sys.executable, "-m", "vla_runtime.cli", "bench", "safety", "--quick", "--json",
         "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(out.stdout.strip().splitlines()) == 1
    result = json.loads(out.stdout)
    for key in ("hazard_recall", "false_veto_rate", "check_ms", "inference_ms", "met", "by_kind"):
        assert key in result, key
    assert set(result["check_ms"]) >= {"p50", "p99"} and result["check_ms"]["p99"] > 0
    assert set(result["met"]) == {"hazard_recall", "false_veto_rate",
                                  "check_ms_p99_below_inference"}  # fmt: skip
    assert set(result["by_kind"]) == set(safety.KINDS)
    assert result["counts"]["policy_chunks"] > 0 and result["counts"]["generated"] > 0
    assert 0.0 <= result["hazard_recall"] <= 1.0 and result["inference_ms"]["p50"] > 0
