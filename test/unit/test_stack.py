from pathlib import Path

import pytest
import yaml

from vla_runtime.core import topics
from vla_runtime.core.robot import load_robot
from vla_runtime.data.calibrate import SIM_OUT
from vla_runtime.stack.resolver import (
    StackError,
    available_stacks,
    coerce_scalar,
    params_file_content,
    resolve_stack,
    ros_arguments,
    substitute,
)


def test_shipped_stacks_are_listed():
    assert {"sim", "franka", "ur"} <= set(available_stacks())


def test_sim_stack_resolves_driver_and_two_cameras():
    stack = resolve_stack("sim")
    assert [n.name for n in stack.nodes] == ["sim_driver", "scene_camera", "wrist_camera"]
    assert stack.use_sim_time
    driver, scene, wrist = stack.nodes
    assert driver.parameters["use_sim_time"] is False  # the clock source keeps wall time
    assert scene.parameters == {
        "use_sim_time": False,  # renders on scene states, stamped with their sim time
        "camera_name": "scene",
        "source": "sim",
        "fps": 15.0,
        "width": 224,
        "height": 224,
        "calibration_dir": "calibration/sim",  # `vla-runtime calibrate --sim` results, if any
    }
    assert wrist.parameters["camera_name"] == "wrist"
    assert "/joint_states" in stack.report_topics


def test_arguments_override_and_keep_types():
    stack = resolve_stack("sim", {"seed": 7, "image_size": 96, "lockstep": True})
    driver, scene, _ = stack.nodes
    assert driver.parameters["seed"] == 7 and driver.parameters["lockstep"] is True
    assert scene.parameters["width"] == 96 and scene.parameters["height"] == 96


def test_policy_part_is_included_in_every_stack_with_its_robot():
    for stack, overrides, robot in [
        ("sim", {}, "fr3"),
        ("franka", {"robot_type": "panda"}, "panda"),
        ("ur", {"use_sim": True}, "ur5e"),
    ]:
        resolved = resolve_stack(stack, {"policy": True, **overrides})
        pipeline = [n for n in resolved.nodes if n.name in ("engine", "safety", "streamer")]
        assert [n.name for n in pipeline] == ["engine", "safety", "streamer"]
        assert {n.parameters["robot"] for n in pipeline} == {robot}
        assert all(n.remappings == () for n in pipeline)  # identity remaps are dropped
        assert "/vla/streamer/stats" in resolved.report_topics
        assert len(set(resolved.report_topics)) == len(resolved.report_topics)
    franka = resolve_stack("franka", {"policy": True, "joint_states_topic": "/franka/joint_states"})
    engine = next(n for n in franka.nodes if n.name == "engine")
    assert engine.remappings == (("/joint_states", "/franka/joint_states"),)
    assert "engine" not in [n.name for n in resolve_stack("sim").nodes]  # policy is opt-in


def test_the_sim_streamer_leads_by_the_delay_to_the_arm_on_the_tracking_servo_only():
    def streamer(**overrides):
        stack = resolve_stack("sim", {"policy": True, **overrides})
        return next(n for n in stack.nodes if n.name == "streamer").parameters

    tracking = streamer(servo_feedforward=True)
    calibrated = yaml.safe_load((Path(__file__).parents[2] / SIM_OUT / "latency.yaml").read_text())
    measured = calibrated["command_to_motion"]["median_s"]
    assert tracking["driver_delay_s"] == pytest.approx(measured, abs=0.001)
    assert tracking["lead_trajectory_lookahead"] is True
    assert tracking["command_interface"] == "trajectory"
    assert tracking["trajectory_lookahead"] == 6.0
    lagging = streamer()
    assert lagging["driver_delay_s"] == 0.0 and lagging["lead_trajectory_lookahead"] is False
    assert streamer(servo_feedforward=True, driver_delay_s=0.05)["driver_delay_s"] == 0.05


def test_variables_cannot_be_overridden(tmp_path):
    stack = tmp_path / "v.yaml"
    stack.write_text(
        "arguments: {a: {default: 1}}\nvariables: {a: 2}\nnodes: [{name: n, executable: x}]\n"
    )
    with pytest.raises(StackError, match="shadows an argument"):
        resolve_stack(stack)


def test_franka_switches_between_sim_and_devices():
    real = resolve_stack("franka")
    assert [n.name for n in real.nodes] == ["scene_camera", "wrist_camera"]
    assert real.nodes[0].parameters["source"] == "device"
    assert not real.use_sim_time
    # a string-typed argument stays a string even when it looks like a number
    assert resolve_stack("franka", {"scene_device": 3}).nodes[0].parameters["device"] == "3"
    sim = resolve_stack("franka", {"use_sim": True})
    assert [n.name for n in sim.nodes] == ["sim_driver", "scene_camera", "wrist_camera"]
    assert sim.nodes[1].parameters["source"] == "sim" and sim.use_sim_time


def test_unknown_argument_and_refused_combination_are_clear_errors():
    with pytest.raises(StackError, match="no argument"):
        resolve_stack("sim", {"not_an_arg": 1})
    with pytest.raises(StackError, match="tf_prefix must be a ROS name fragment"):
        resolve_stack("ur", {"tf_prefix": "left-"})
    with pytest.raises(StackError, match="no stack 'nope'"):
        resolve_stack("nope")


def test_substitution_rules():
    args = {"a": 3, "b": "x"}
    assert substitute("$(arg a)", args) == 3
    assert substitute("n$(arg a)-$(arg b)", args) == "n3-x"
    assert substitute({"k": ["$(arg b)"]}, args) == {"k": ["x"]}
    with pytest.raises(StackError, match=r"\$\(arg c\)"):
        substitute("$(arg c)", args)
    assert coerce_scalar("true") is True and coerce_scalar("0.5") == 0.5
    assert coerce_scalar("/dev/video0") == "/dev/video0"


def test_bad_stack_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: a\n")
    with pytest.raises(StackError, match="needs `name` and `executable`"):
        resolve_stack(bad)
    dup = tmp_path / "dup.yaml"
    dup.write_text("nodes:\n  - {name: a, executable: x}\n  - {name: a, executable: y}\n")
    with pytest.raises(StackError, match="two nodes named 'a'"):
        resolve_stack(dup)


def test_conditions_may_compare_an_argument_and_select_report_topics(tmp_path):
    stack = tmp_path / "c.yaml"
    stack.write_text(
        "arguments: {mode: {default: slow}, armed: {default: true}}\n"
        "nodes:\n"
        "  - {name: fast, executable: x, if: mode == fast}\n"
        "  - {name: other, executable: x, unless: [mode == fast, armed]}\n"
        "  - {name: keep, executable: x}\n"
        "report:\n"
        "  topics:\n"
        "    - /always\n"
        "    - {topic: /fast/$(arg mode), if: [mode == fast, armed]}\n"
        "    - {topic: /slow, unless: mode == fast}\n"
    )
    slow = resolve_stack(stack)
    assert [n.name for n in slow.nodes] == ["keep"]
    assert slow.report_topics == ("/always", "/slow")
    fast = resolve_stack(stack, {"mode": "fast"})
    assert [n.name for n in fast.nodes] == ["fast", "keep"]
    assert fast.report_topics == ("/always", "/fast/fast")
    assert resolve_stack(stack, {"mode": "fast", "armed": False}).report_topics == ("/always",)
    assert [n.name for n in resolve_stack(stack, {"armed": False}).nodes] == ["other", "keep"]
    stack.write_text("nodes: [{name: a, executable: x}]\nreport: {topics: [{if: armed}]}\n")
    with pytest.raises(StackError, match="needs `topic`"):
        resolve_stack(stack)


@pytest.mark.parametrize("robot", ["fr3", "ur5e"])
@pytest.mark.parametrize("interface", ["trajectory", "forward_position", None])
def test_sim_stack_monitors_the_topic_its_gate_commands(robot, interface):
    """The run report measures the arm command topic the safety gate publishes on, as the node
    names it (nodes/safety.py) for the stack's robot and command_interface (default trajectory)."""
    args = {"policy": True, "robot": robot}
    if interface is not None:
        args["command_interface"] = interface
    stack = resolve_stack("sim", args)
    safety = next(n for n in stack.nodes if n.name == "safety")
    chosen = safety.parameters["command_interface"]
    assert chosen == (interface or "trajectory")
    controllers = load_robot(robot).controllers
    gate = (
        topics.trajectory_command(controllers["trajectory"])
        if chosen == "trajectory"
        else topics.forward_command(controllers["forward_position"])
    )
    arm_commands = {
        topics.trajectory_command(controllers["trajectory"]),
        topics.forward_command(controllers["forward_position"]),
    }
    assert arm_commands & set(stack.report_topics) == {gate}


def test_ros_arguments_and_params_file():
    stack = resolve_stack("sim")
    node = stack.nodes[1]
    argv = ros_arguments(node, "/tmp/p.yaml")
    assert argv[:5] == ["--ros-args", "-r", "__node:=scene_camera", "--params-file", "/tmp/p.yaml"]
    params = yaml.safe_load(params_file_content(node))
    assert params["/**"]["ros__parameters"]["camera_name"] == "scene"


def test_node_niceness(tmp_path):
    stack = tmp_path / "n.yaml"
    stack.write_text(
        "nodes:\n  - {name: a, executable: x, nice: 5}\n  - {name: b, executable: y}\n"
    )
    a, b = resolve_stack(stack).nodes
    assert (a.nice, b.nice) == (5, 0)
    stack.write_text("nodes:\n  - {name: a, executable: x, nice: 40}\n")
    with pytest.raises(StackError, match="nice must be an integer"):
        resolve_stack(stack)
