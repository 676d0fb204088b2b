"""Stack node conditions naming several arguments, and where the stacks use them."""

import pytest

from vla_runtime.core.help_text import SERVO_FEEDFORWARD_OPTION
from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD
from vla_runtime.sim.workcell import SceneConfig
from vla_runtime.stack.resolver import StackError, resolve_stack


def test_if_and_unless_may_list_several_arguments(tmp_path):
    stack = tmp_path / "c.yaml"
    stack.write_text(
        "arguments: {a: {default: true}, b: {default: false}, c: {default: false}}\n"
        "nodes:\n"
        "  - {name: keep, executable: x}\n"
        "  - {name: both, executable: x, if: [a, b]}\n"
        "  - {name: neither, executable: x, unless: [b, c]}\n"
    )
    names = [n.name for n in resolve_stack(stack).nodes]
    assert names == ["keep", "neither"]
    names = [n.name for n in resolve_stack(stack, {"b": True}).nodes]
    assert names == ["keep", "both"]


def test_franka_gripper_bridge_runs_only_on_the_franka_ros2_policy_path():
    def bridge(**args):
        nodes = resolve_stack("franka", args).nodes
        return [n.parameters for n in nodes if n.name == "franka_gripper_bridge"]

    assert bridge(policy=True) == [{"use_sim_time": False, "robot": "fr3", "joint_prefix": "",
                                    "action_namespace": "/franka_gripper",
                                    "command_source": "/safety"}]  # fmt: skip
    assert bridge() == []  # no policy, no gate gripper commands
    assert bridge(policy=True, use_sim=True) == []  # the sim driver takes them
    assert bridge(policy=True, direct=True, robot_ip="10.0.0.2") == []  # franky does


def test_ur_streamer_follows_the_ur_speed_scaling_and_others_do_not():
    def streamer(stack, **args):
        nodes = resolve_stack(stack, {"policy": True, **args}).nodes
        return next(n for n in nodes if n.name == "streamer").parameters

    topic = "/speed_scaling_state_broadcaster/speed_scaling"
    assert streamer("ur")["speed_scaling_topic"] == topic
    ur_sim = resolve_stack("ur", {"policy": True, "use_sim": True}).nodes
    assert next(n for n in ur_sim if n.name == "sim_driver").parameters[
        "speed_scaling_topic"
    ] == topic  # fmt: skip
    assert streamer("ur", speed_scaling_topic="")["speed_scaling_topic"] == ""
    assert streamer("franka")["speed_scaling_topic"] == ""
    assert streamer("sim")["speed_scaling_topic"] == ""


def test_a_default_naming_another_argument_is_what_refusals_see(tmp_path):
    stack = tmp_path / "d.yaml"
    stack.write_text(
        "arguments: {sim: {default: false}, tracks: {default: $(arg sim)}}\n"
        "refuse: [{if: tracks, unless: sim, message: simulated only}]\n"
        "nodes: [{name: driver, executable: x, parameters: {tracks: $(arg tracks)}}]\n"
    )

    def tracks(**args):
        return resolve_stack(stack, args).nodes[0].parameters["tracks"]

    assert tracks() is False
    assert tracks(sim=True) is True
    assert tracks(sim=True, tracks=False) is False
    with pytest.raises(StackError, match="simulated only"):
        resolve_stack(stack, {"tracks": True})


@pytest.mark.parametrize(
    ("stack", "args"),
    [("sim", {}), ("sim", {"robot": "ur5e"}), ("ur", {"use_sim": True}),
     ("franka", {"use_sim": True})],
)  # fmt: skip
def test_a_simulated_arms_servo_defaults_as_every_command_does(stack, args):
    nodes = resolve_stack(stack, args).nodes
    driver = next(n for n in nodes if n.name == "sim_driver").parameters
    assert driver.get("servo_feedforward", SceneConfig.servo_feedforward) is SIM_SERVO_FEEDFORWARD
    assert SERVO_FEEDFORWARD_OPTION["default"] is SIM_SERVO_FEEDFORWARD
