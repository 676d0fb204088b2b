"""`vla-runtime launch franka direct:=true franky_sim:=true`: the franka direct stack's dry run
on franky-sim in the workcell, resolved as the launcher starts it."""

from __future__ import annotations

from vla_runtime.stack.resolver import resolve_stack


def nodes(**arguments) -> dict:
    stack = resolve_stack("franka", {"direct": True, "franky_sim": True, **arguments})
    return {n.name: n.parameters for n in stack.nodes}


def test_franky_sim_stands_in_for_the_arm_and_the_cameras_render_its_scene():
    found = nodes(franky_sim_ip="127.0.0.7", seed=4)
    assert found["franky_workcell"]["hostname"] == "127.0.0.7"
    assert found["franky_workcell"]["seed"] == 4
    driver = found["franky_driver"]
    assert driver["robot_ip"] == "127.0.0.7" and driver["realtime_config"] == "ignore"
    for camera in ("scene_camera", "wrist_camera"):
        assert found[camera]["source"] == "sim"
        assert found[camera]["calibration_dir"] == "calibration/sim"


def test_the_stack_runs_on_franky_sims_clock_at_the_control_rate():
    found = nodes(policy=True, checkpoint="ckpt", control_rate_hz=200.0)
    workcell = found.pop("franky_workcell")
    assert workcell["use_sim_time"] is False  # the clock source
    assert workcell["clock_rate_hz"] == 200.0  # sim-time timers fire on /clock updates
    # The cameras stamp frames with the scene states' sim time and need no clock.
    cameras = [found.pop(c) for c in ("scene_camera", "wrist_camera")]
    assert all(p["use_sim_time"] is False for p in cameras)
    assert sorted(found) == ["engine", "franky_driver", "safety", "streamer"]
    assert all(p["use_sim_time"] is True for p in found.values())


def test_without_franky_sim_the_direct_stack_is_unchanged():
    stack = resolve_stack("franka", {"direct": True, "robot_ip": "172.16.0.2"})
    found = {n.name: n.parameters for n in stack.nodes}
    assert "franky_workcell" not in found
    assert found["franky_driver"]["robot_ip"] == "172.16.0.2"
    assert found["franky_driver"]["realtime_config"] == "enforce"
    assert found["scene_camera"]["source"] == "device"
    assert all(p["use_sim_time"] is False for p in found.values())


def test_the_scene_camera_may_publish_bigger_images_than_the_policy_takes():
    stack = resolve_stack("franka", {"image_size": 96, "scene_image_size": 224})
    found = {n.name: n.parameters for n in stack.nodes}
    assert (found["scene_camera"]["width"], found["wrist_camera"]["width"]) == (224, 96)
    stack = resolve_stack("franka", {"image_size": 96})
    assert [n.parameters["width"] for n in stack.nodes if "camera" in n.name] == [96, 96]


def test_the_scene_cameras_size_follows_the_checkpoints_by_default():
    stack = resolve_stack(
        "franka", {"direct": True, "franky_sim": True, "policy": True,
                   "checkpoint": "checkpoints/vla_tiny_sim"},
    )  # fmt: skip
    assert [n.parameters["width"] for n in stack.nodes if "camera" in n.name] == [96, 96]
