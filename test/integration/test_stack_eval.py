"""`vla-runtime eval --via stack`: episodes on the real node stack in real time. A run whose
policy got no action executed ends non-zero with a one-line reason, its episodes on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest

from vla_runtime.data.rollout_trajectories import load_trajectories

pytestmark = pytest.mark.timeout(600)


def test_a_run_that_executed_no_chunk_exits_non_zero_with_the_reason(tmp_path):
    out = tmp_path / "episodes.jsonl"
    # Every chunk is published 2 s after its images: older than the safety node accepts (1 s),
    # so each one is judged stale and nothing reaches the arm.
    proc = subprocess.run(
        [sys.executable, "-m", "vla_runtime.cli", "eval", "--task", "reach", "--episodes", "1",
         "--out", str(out), "--set", "inference_delay:=2.0", "--json", "--no-progress",
         "--report", str(tmp_path / "report"), "--trajectories", str(tmp_path / "paths")],
        capture_output=True, text=True, timeout=580, env={**os.environ, "MUJOCO_GL": "egl"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    reason = [line for line in proc.stderr.splitlines() if "FAILED" in line]
    assert len(reason) == 1 and "no action of the policy was executed" in reason[0], proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["executed_actions"] == 0 and summary["success_rate"] == 0.0
    assert summary["verdicts"]["stale"] >= 1 and summary["verdicts"]["accept"] == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in records] == [90000]
    assert records[0]["outcome"] == "timeout"
    # The report shows the same run: every plot on the page is a real image.
    page = (tmp_path / "report" / "index.html").read_text()
    for name in ("outcomes.png", "latency.png", "joints.png"):
        assert f'src="{name}"' in page
        image = plt.imread(tmp_path / "report" / name)
        assert image.shape[0] > 200 and image.std() > 0.01, name
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["episodes"] == 1
    # The arm's path is kept for `collect --replay`: it held at home throughout.
    (path,) = load_trajectories(tmp_path / "paths", "reach", "fr3")
    assert path.seed == 90000 and not path.success and path.duration > 5.0
    np.testing.assert_allclose(path.arm, np.tile(path.arm[0], (len(path.t), 1)), atol=1e-3)


@pytest.mark.integration
def test_lockstep_ablation_runs_the_stack_files_nodes_and_the_shipped_policy_succeeds(ros_domain):
    """`eval --via jtc`: the sim stack's driver, cameras and engine in lock-step, each chunk
    sent whole to the JTC. Deterministic: the shipped policy touches the cube on this seed."""
    from vla_runtime.core.paths import shipped_checkpoint
    from vla_runtime.data.evaluate import evaluate_stack

    summary = evaluate_stack(str(shipped_checkpoint()), "reach", 1, seed=90000, progress=False)
    assert summary["success_rate"] == 1.0, summary
    assert summary["modes"] == {"v0d0": 1.0}


@pytest.mark.integration
def test_the_shipped_ur5e_policy_runs_on_the_simulated_ur5e(ros_domain):
    """The same ablation with the UR5e's checkpoint: the stack takes the arm from its spec and
    judges success on the UR5e's own scene. Deterministic on this seed."""
    from vla_runtime.core.paths import shipped_checkpoint
    from vla_runtime.data.evaluate import evaluate_stack

    summary = evaluate_stack(str(shipped_checkpoint("ur5e")), "reach", 1, seed=90001,
                             progress=False)  # fmt: skip
    assert summary["success_rate"] == 1.0, summary


@pytest.mark.integration
def test_bench_scheduler_runs_both_arms_through_the_product_path(tmp_path):
    """`bench scheduler` on one reach episode per arm: the full arm runs only full compute, the
    scheduled arm (scheduler node in the stack) runs the modes it was sent, and every figure
    comes from what the stack's engine reported."""
    proc = subprocess.run(
        [sys.executable, "-m", "vla_runtime.cli", "bench", "scheduler", "--tasks", "reach",
         "--episodes", "1", "--out", str(tmp_path), "--project-onto", "tiny", "--json",
         "--no-progress"],
        capture_output=True, text=True, timeout=580, env={**os.environ, "MUJOCO_GL": "egl"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    reach = result["tasks"]["reach"]
    assert reach["modes"]["full"] == {"v0d0": 1.0}
    scheduled = reach["modes"]["scheduled"]
    assert sum(scheduled.values()) == pytest.approx(1.0)
    # the first inference of an episode is full; the scheduler reuses caches after it
    assert set(scheduled) - {"v0d0", "v1d0"}, scheduled
    assert reach["engine_ms_per_control_s"]["full"] > 0 and reach["speedup"] > 0
    assert all(hz > 0 for hz in reach["inference_hz"].values())
    assert result["projection"]["preset"] == "tiny" and result["projected_speedup_tiny"] > 0
    assert set(result["met"]) == {"speedup", "success_drop"}
    for arm in ("full", "scheduled"):
        records = [json.loads(line) for line in (tmp_path / f"reach_{arm}.jsonl").open()]
        assert [r["seed"] for r in records] == [90000] and records[0]["modes"]
    assert plt.imread(tmp_path / "scheduler.png").std() > 0.01


@pytest.mark.integration
def test_a_stop_latched_in_one_episode_is_reported_and_cleared_before_the_next():
    """An e-stop pressed mid-episode latches the gate: that episode ends as a safety stop with
    its reason, and the evaluation clears the latch as the operator does before the next
    episode, whose arm moves again (a latch would otherwise hold every later episode)."""
    import threading
    import time

    from std_msgs.msg import Bool

    from vla_runtime.core import topics
    from vla_runtime.data.stack_eval import StackHarness, run_episode
    from vla_runtime.stack.resolver import resolve_stack

    harness = StackHarness(resolve_stack("sim", {"task": "reach", "policy": True}))
    try:
        harness.warm_up("reach")
        estop = harness.node.create_publisher(Bool, topics.ESTOP, 10)
        announced = len(harness.episodes)

        def press_when_the_episode_starts() -> None:
            deadline = time.monotonic() + 120.0
            while len(harness.episodes) == announced and time.monotonic() < deadline:
                time.sleep(0.005)  # polls the condition; run_episode spins the node meanwhile
            estop.publish(Bool(data=True))

        press = threading.Thread(target=press_when_the_episode_starts)
        press.start()
        stopped = run_episode(harness, "reach", 90000)
        press.join()
        assert stopped.outcome == "safety_stop" and not stopped.success, stopped
        assert stopped.safety_stops and stopped.safety_stops[0].startswith("estop"), stopped
        assert harness.gate_latched
        harness.forget_reports()
        harness.clear_latch("test: the next episode starts")
        assert not harness.gate_latched
        moving = run_episode(harness, "reach", 90001)
        assert moving.outcome != "safety_stop" and not moving.safety_stops, moving
        assert moving.best_progress["tcp_to_target_m"] < 0.1, moving  # the arm went to the cube
    finally:
        harness.close()
