"""What `launch ... policy:=true` takes from the policy's checkpoint, and when a launch that ran
the policy counts as having done nothing."""

from __future__ import annotations

import json

import pytest

from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.core.policy_checkpoint import checkpoint_image_size, policy_arguments
from vla_runtime.stack.launcher import format_summary, policy_failure
from vla_runtime.stack.resolver import resolve_stack


def node(stack, name):
    return next(n for n in stack.nodes if n.name == name)


@pytest.mark.parametrize(
    "stack, args, robot",
    [("sim", {}, "fr3"), ("sim", {"robot": "ur5e"}, "ur5e"), ("ur", {"use_sim": True}, "ur5e"),
     ("franka", {"use_sim": True}, "fr3")],
)  # fmt: skip
def test_a_simulated_arm_runs_its_shipped_policy_at_the_policy_image_size(stack, args, robot):
    resolved = resolve_stack(stack, {"policy": True, **args})
    assert node(resolved, "engine").parameters["checkpoint"] == str(shipped_checkpoint(robot))
    size = checkpoint_image_size(shipped_checkpoint(robot))
    assert size == 96
    for camera in ("scene_camera", "wrist_camera"):
        parameters = node(resolved, camera).parameters
        assert (parameters["width"], parameters["height"]) == (size, size)
    assert any("checkpoint:=" in note and "shipped" in note for note in resolved.notes)


@pytest.mark.parametrize(
    "stack, args, robot",
    [("sim", {"servo_feedforward": True}, "fr3"),
     ("sim", {"robot": "ur5e", "servo_feedforward": True}, "ur5e"),
     ("ur", {"use_sim": True, "servo_feedforward": True}, "ur5e"), ("gazebo", {}, "fr3")],
)  # fmt: skip
def test_a_simulated_arm_whose_servo_tracks_runs_the_policy_trained_for_that_servo(
    stack, args, robot
):
    resolved = resolve_stack(stack, {"policy": True, **args})
    engine = node(resolved, "engine").parameters
    tracking = shipped_checkpoint(robot, servo_feedforward=True)
    assert engine["checkpoint"] == str(tracking) != str(shipped_checkpoint(robot))
    spec = json.loads((tracking / "spec.json").read_text())["spec"]
    assert spec["robot"] == robot and checkpoint_image_size(tracking) == 96
    # What the Gazebo launch sizes its cameras by.
    assert resolved.values["checkpoint"] == str(tracking) and resolved.values["image_size"] == 96


def test_what_is_given_is_kept_and_a_real_arm_gets_no_policy_by_default(tmp_path):
    given = resolve_stack("sim", {"policy": True, "image_size": 224})
    assert node(given, "scene_camera").parameters["width"] == 224
    real = resolve_stack("ur", {"policy": True})
    assert node(real, "engine").parameters["checkpoint"] == ""
    assert node(real, "scene_camera").parameters["width"] == 224
    remote = resolve_stack("sim", {"policy": True, "backend": "remote"})
    assert node(remote, "engine").parameters["checkpoint"] == ""
    # A checkpoint whose spec cannot be read: left for the engine to refuse in one line.
    args = {"policy": True, "backend": "torch", "checkpoint": str(tmp_path), "image_size": 224}
    assert policy_arguments(args, {"checkpoint"}, simulated=True) == {}
    (tmp_path / "spec.json").write_text(json.dumps({"spec": {"cameras": [
        {"name": "scene", "height": 64, "width": 64}]}}))  # fmt: skip
    assert policy_arguments(args, {"checkpoint"}, simulated=False) == {"image_size": 64}


def report(chunks, verdicts, last_error="", published_now=0):
    """A run report: `chunks` on /vla/action_chunk over the run, the safety verdicts over the
    run, and the engine's last stats (its counters restart with each episode)."""
    return {
        "nodes": {"engine": {}, "streamer": {}, "safety": {}},
        "topics": {"/vla/action_chunk": {"count": chunks}},
        "diagnostics": {
            "/vla/engine/stats": {
                "engine": {"chunks_published": str(published_now), "last_error": last_error}
            },  # fmt: skip
        },
        "events": {"/vla/safety/events": {f"chunk:{k}": n for k, n in verdicts.items()}},
    }


def test_a_policy_run_that_moved_nothing_is_a_failure_that_says_why():
    error = "input: camera 'wrist' frame rejected: 224x224 but the policy wants 96x96"
    assert policy_failure(report(0, {}, error)) == f"the engine published no chunk ({error})"
    assert policy_failure(report(174, {"veto": 174})) == (
        "the safety node let none of the engine's 174 chunks through (verdicts: veto 174)"
    )
    # Judged over the run: a new episode's stats restart at 0 after chunks went through.
    assert policy_failure(report(20, {"accept": 18, "veto": 2}, published_now=0)) is None
    assert policy_failure(report(20, {"clip": 1, "veto": 19})) is None
    assert policy_failure({"nodes": {"sim_driver": {}}}) is None  # no policy in this stack
    # chunks the safety node judged were published, though the run's count missed them
    assert policy_failure(report(0, {"clip": 3}, published_now=0)) is None


def test_the_summary_names_the_policy_failure():
    failed = {**report(0, {}, "no image yet"), "stack": "sim", "duration_s": 20.0,
              "clock": "sim", "wall_s": 25.0, "domain_id": 3, "ok": False,
              "policy_failure": "the engine published no chunk (no image yet)"}  # fmt: skip
    failed["nodes"], failed["topics"] = {}, {}
    text = format_summary(failed)
    assert "FAILED" in text.splitlines()[0]
    assert "  policy: the engine published no chunk (no image yet)" in text
