"""The franka and ur stacks take the vendors' bringup argument names (franka_bringup,
ur_robot_driver's ur_control.launch.py): what each resolves to, and the one-line refusals."""

from __future__ import annotations

import pytest

from vla_runtime.stack.resolver import StackError, resolve_stack, ros_arguments


def nodes(stack: str, **args) -> dict:
    return {n.name: n for n in resolve_stack(stack, args).nodes}


def refusal(stack: str, **args) -> str:
    with pytest.raises(StackError) as exc:
        resolve_stack(stack, args)
    text = str(exc.value)
    assert "\n" not in text
    return text


# franka_bringup


@pytest.mark.parametrize(
    "args, robot",
    [({}, "fr3"), ({"arm_id": "fr3"}, "fr3"), ({"robot_type": "fer"}, "panda"),
     ({"arm_id": "fer"}, "panda"), ({"robot_type": "panda"}, "panda"),
     ({"arm_id": "fer", "robot_type": "fer"}, "panda")],
)  # fmt: skip
def test_franka_robot_type_and_arm_id_select_the_robot(args, robot):
    bridge = nodes("franka", policy=True, **args)["franka_gripper_bridge"]
    assert bridge.parameters["robot"] == robot


def test_franka_robot_names_without_a_description_here_are_refused():
    assert "disagree (both set robot_type)" in refusal("franka", arm_id="fer", robot_type="fr3")
    assert "no FP3 description" in refusal("franka", robot_type="fp3")
    assert "no FR3v2 description" in refusal("franka", arm_id="fr3v2")
    assert "robot_type must be one of ['fer', 'fr3', 'panda']" in refusal("franka", arm_id="x")
    assert "models only the FR3" in refusal("franka", use_fake_hardware=True, arm_id="fer")


def test_franka_fake_hardware_is_the_simulation():
    fake = resolve_stack(
        "franka", {"use_fake_hardware": True, "load_gripper": True, "arm_id": "fr3"}
    )
    sim = resolve_stack("franka", {"use_sim": True})
    assert fake.nodes == sim.nodes and fake.use_sim_time
    assert [n.name for n in fake.nodes] == ["sim_driver", "scene_camera", "wrist_camera"]
    assert fake.nodes[0].parameters["robot"] == "fr3"
    assert "disagree" in refusal("franka", use_fake_hardware=True, use_sim=False)


def test_franka_fake_sensor_commands_only_with_fake_hardware():
    assert refusal("franka", fake_sensor_commands=True) == (
        "stack 'franka' with fake_sensor_commands:=true use_sim:=false: fake sensor commands "
        "exist only with fake hardware (use_fake_hardware:=true)."
    )
    stack = resolve_stack("franka", {"use_fake_hardware": True, "fake_sensor_commands": True})
    assert [n.name for n in stack.nodes][0] == "sim_driver"
    assert any("fake_sensor_commands changes nothing" in note for note in stack.notes)


def test_franka_load_gripper_starts_the_gripper_bridge():
    assert "franka_gripper_bridge" in nodes("franka", policy=True)  # on by default
    assert "franka_gripper_bridge" in nodes("franka", policy=True, load_gripper=True)
    assert "franka_gripper_bridge" not in nodes("franka", policy=True, load_gripper=False)
    sim = resolve_stack("franka", {"use_sim": True, "load_gripper": False})
    assert any("carries its hand" in note for note in sim.notes)


def test_franka_namespace_moves_the_nodes_and_the_driver_topics():
    stack = resolve_stack(
        "franka",
        {"policy": True, "namespace": "left", "joint_states_topic": "/franka/joint_states"},
    )
    by_name = {n.name: n for n in stack.nodes}
    assert {n.namespace for n in stack.nodes} == {"/left"}
    safety = dict(by_name["safety"].remappings)
    assert safety["/joint_states"] == "/left/franka/joint_states"
    assert (
        safety["/fr3_arm_controller/joint_trajectory"]
        == "/left/fr3_arm_controller/joint_trajectory"
    )
    assert (
        safety["/forward_position_controller/commands"]
        == "/left/forward_position_controller/commands"
    )
    assert safety["/fr3_gripper/commands"] == "/left/fr3_gripper/commands"
    assert by_name["franka_gripper_bridge"].parameters["action_namespace"] == "/left/franka_gripper"
    assert (
        "/left/joint_states" in stack.report_topics and "/joint_states" not in stack.report_topics
    )
    assert "/vla/action_chunk" in stack.report_topics  # the runtime's own topics stay global
    argv = ros_arguments(by_name["safety"], "/tmp/p.yaml")
    assert argv[argv.index("-r", 4) : argv.index("-r", 4) + 2] == ["-r", "__ns:=/left"]

    sim = nodes("franka", use_fake_hardware=True, namespace="/a/b/")
    driver = dict(sim["sim_driver"].remappings)
    assert sim["sim_driver"].namespace == "/a/b"
    assert driver["/joint_states"] == "/a/b/joint_states"
    assert (
        driver["/fr3_arm_controller/joint_trajectory"] == "/a/b/fr3_arm_controller/joint_trajectory"
    )
    panda = dict(nodes("franka", policy=True, arm_id="fer", namespace="r")["safety"].remappings)
    assert panda["/fer_arm_controller/joint_trajectory"] == "/r/fer_arm_controller/joint_trajectory"
    assert all(n.namespace == "" and n.remappings == () for n in resolve_stack("franka").nodes)
    assert "is no ROS namespace" in refusal("franka", namespace="2arms")


ROBOT_NODES = {"sim_driver", "franky_driver", "ur_driver", "franka_gripper_bridge", "engine",
               "safety", "streamer", "scheduler"}  # fmt: skip


def joint_prefixes(stack: str, **args) -> dict:
    """{node: its joint_prefix} of every node that loads a robot description (all have one)."""
    by_name = nodes(stack, policy=True, scheduler=True, **args)
    assert {n for n, node in by_name.items() if "robot" in node.parameters} <= ROBOT_NODES
    return {n: node.parameters["joint_prefix"] for n, node in by_name.items()
            if "robot" in node.parameters}  # fmt: skip


@pytest.mark.parametrize("path", [{"use_fake_hardware": True}, {"direct": True}, {}])
def test_franka_arm_prefix_is_joined_with_an_underscore_for_every_node(path):
    # franka_description: arm_prefix:=left names the joints left_fr3_joint1..
    prefixes = joint_prefixes("franka", arm_prefix="left", **path)
    assert len(prefixes) >= 4 and set(prefixes.values()) == {"left_"}
    assert set(joint_prefixes("franka", **path).values()) == {""}
    assert set(joint_prefixes("franka", arm_prefix="left_", **path).values()) == {"left__"}


def test_franka_malformed_arm_prefix_is_refused_in_one_line():
    for prefix in ("left-arm", "2arms", "a/b", "left arm"):
        assert refusal("franka", arm_prefix=prefix) == (
            f"stack 'franka' with arm_prefix:={prefix}: arm_prefix must be a ROS name fragment "
            "(letters, digits and underscores, not starting with a digit), as it starts every "
            "joint name."
        )


# ur_robot_driver


def test_ur_mock_hardware_is_the_simulated_ur5e():
    mock = resolve_stack("ur", {"use_mock_hardware": True, "ur_type": "ur5e"})
    assert mock.nodes == resolve_stack("ur", {"use_sim": True}).nodes
    assert [n.name for n in mock.nodes] == ["sim_driver", "scene_camera", "wrist_camera"]
    assert "only with mock hardware" in refusal("ur", mock_sensor_commands=True)
    noted = resolve_stack("ur", {"use_mock_hardware": True, "mock_sensor_commands": True})
    assert any("mock_sensor_commands changes nothing" in note for note in noted.notes)


def test_the_simulated_ur5e_runs_at_the_sim_stacks_control_rate_and_a_real_one_at_250_hz():
    def rates(**arguments):
        stack = resolve_stack("ur", {"policy": True, **arguments})
        nodes = {n.name: n.parameters for n in stack.nodes}
        return nodes["safety"]["control_rate_hz"], nodes["streamer"]["control_rate_hz"], nodes

    gate, streamer, nodes = rates(use_sim=True)
    assert gate == streamer == 100.0  # as config/stacks/sim.yaml, on a host the sim shares
    assert nodes["sim_driver"]["clock_rate_hz"] == nodes["sim_driver"]["state_rate_hz"] == 100.0
    assert rates()[:2] == (250.0, 250.0)
    gate, _, nodes = rates(use_sim=True, control_rate_hz=250.0)
    assert gate == nodes["sim_driver"]["clock_rate_hz"] == 250.0


@pytest.mark.parametrize(
    "controller, interface, trajectory_topic",
    [
        (None, "trajectory", "/scaled_joint_trajectory_controller/joint_trajectory"),
        ("scaled_joint_trajectory_controller", "trajectory",
         "/scaled_joint_trajectory_controller/joint_trajectory"),
        ("joint_trajectory_controller", "trajectory",
         "/joint_trajectory_controller/joint_trajectory"),
        ("forward_position_controller", "forward_position",
         "/scaled_joint_trajectory_controller/joint_trajectory"),
    ],
)  # fmt: skip
def test_ur_initial_joint_controller_selects_the_gate_and_driver_topics(
    controller, interface, trajectory_topic
):
    args = {"policy": True, "use_mock_hardware": True}
    if controller is not None:
        args["initial_joint_controller"] = controller
    by_name = {n.name: n for n in resolve_stack("ur", args).nodes}
    safety = by_name["safety"]
    assert safety.parameters["command_interface"] == interface
    # The gate names UR's scaled controller; a remap points it at the chosen one.
    gate_topic = dict(safety.remappings).get(
        "/scaled_joint_trajectory_controller/joint_trajectory",
        "/scaled_joint_trajectory_controller/joint_trajectory",
    )
    assert gate_topic == trajectory_topic
    driver_controller = by_name["sim_driver"].parameters["trajectory_controller"]
    assert f"/{driver_controller}/joint_trajectory" == trajectory_topic
    direct = nodes("ur", direct=True, robot_ip="10.0.0.2", initial_joint_controller=controller or
                   "scaled_joint_trajectory_controller")["ur_driver"]  # fmt: skip
    assert f"/{direct.parameters['trajectory_controller']}/joint_trajectory" == trajectory_topic


def test_ur_command_interface_given_wins_over_the_initial_controller():
    safety = nodes("ur", policy=True, command_interface="forward_position")["safety"]
    assert safety.parameters["command_interface"] == "forward_position"
    safety = nodes(
        "ur", policy=True, initial_joint_controller="forward_position_controller",
        command_interface="trajectory",
    )["safety"]  # fmt: skip
    assert safety.parameters["command_interface"] == "trajectory"


def test_ur_controllers_that_take_no_positions_are_refused():
    assert refusal("ur", initial_joint_controller="forward_velocity_controller") == (
        "stack 'ur': initial_joint_controller must be one of ['forward_position_controller', "
        "'joint_trajectory_controller', 'scaled_joint_trajectory_controller'], got "
        "'forward_velocity_controller' (the safety gate streams joint positions)"
    )


@pytest.mark.parametrize("path", [{"use_mock_hardware": True}, {"direct": True}, {}])
def test_ur_tf_prefix_is_prepended_as_given_for_every_node(path):
    prefixes = joint_prefixes("ur", tf_prefix="left_", **path)
    assert len(prefixes) >= 4 and set(prefixes.values()) == {"left_"}
    assert set(joint_prefixes("ur", **path).values()) == {""}
    assert "stack 'ur' with tf_prefix:=left-: tf_prefix must be a ROS name fragment" in refusal(
        "ur", tf_prefix="left-"
    )


UR_TYPES = ("ur3e", "ur5e", "ur10e", "ur16e", "ur20", "ur30")  # config/robots/<ur_type>.yaml


@pytest.mark.parametrize("ur_type", UR_TYPES)
@pytest.mark.parametrize("path", [{"direct": True, "robot_ip": "10.0.0.2"}, {}])
def test_every_ur_type_is_the_robot_of_every_node_on_a_real_arm(ur_type, path):
    by_name = nodes("ur", ur_type=ur_type, policy=True, scheduler=True, **path)
    robots = {n: node.parameters["robot"] for n, node in by_name.items()
              if "robot" in node.parameters}  # fmt: skip
    assert set(robots) == {"engine", "safety", "streamer", "scheduler"} | (
        {"ur_driver"} if path else set()
    )
    assert set(robots.values()) == {ur_type}
    if path:
        driver = by_name["ur_driver"].parameters
        assert driver["trajectory_controller"] == "scaled_joint_trajectory_controller"


@pytest.mark.parametrize("ur_type", [t for t in UR_TYPES if t != "ur5e"])
def test_the_simulator_models_only_the_ur5e(ur_type):
    message = (f"stack 'ur' with use_sim:=true ur_type:={ur_type}: the simulator models only the "
               "UR5e (ur_type:=ur5e); other UR types run on a real arm.")  # fmt: skip
    assert refusal("ur", use_mock_hardware=True, ur_type=ur_type) == message
    assert refusal("ur", use_sim=True, ur_type=ur_type) == message


def test_ur_types_without_a_description_are_refused_in_one_line():
    assert refusal("ur", ur_type="ur5", direct=True) == (
        "stack 'ur': ur_type must be one of ['ur10e', 'ur16e', 'ur20', 'ur30', 'ur3e', 'ur5e'], "
        "got 'ur5' (no robot description (limits, kinematics) of other UR types here)"
    )


def test_ur_servo_arguments_take_integers_and_refuse_text():
    # docs/bringup.md: servo_lookahead_s:=0.1 servo_gain:=300 (300 is an integer to YAML)
    driver = nodes("ur", direct=True, servo_lookahead_s=0.1, servo_gain=300)["ur_driver"]
    gain = driver.parameters["servo_gain"]
    assert type(gain) is float and gain == 300.0
    assert "servo_gain: expected a number, got 'stiff'" in refusal("ur", servo_gain="stiff")


def test_ur_camera_source_file_plays_video_files_as_the_franka_stack_does():
    videos = {"camera_source": "file", "scene_device": "scene.avi", "wrist_device": "wrist.avi"}
    ur = nodes("ur", **videos)
    scene, wrist = ur["scene_camera"].parameters, ur["wrist_camera"].parameters
    assert (scene["source"], scene["path"]) == ("file", "scene.avi")
    assert (wrist["source"], wrist["path"]) == ("file", "wrist.avi")
    franka = nodes("franka", **videos)
    assert franka["scene_camera"].parameters == scene
    assert franka["wrist_camera"].parameters == wrist
    device = nodes("ur")["scene_camera"].parameters
    assert (device["source"], device["device"]) == ("device", "0")
    assert nodes("ur", use_sim=True, **videos)["scene_camera"].parameters["source"] == "sim"


def test_launch_rviz_is_a_note():
    assert resolve_stack("ur", {"tf_prefix": "left_"}).notes == ()
    stack = resolve_stack("ur", {"launch_rviz": True})
    assert stack.notes == (
        "note: launch_rviz:=true starts no RViz here; run rviz2 yourself on the stack's ROS domain",
    )
    assert stack.nodes == resolve_stack("ur").nodes


# The resolver features these stacks use


def test_alias_lookup_derived_default_and_stack_remaps(tmp_path):
    stack = tmp_path / "s.yaml"
    stack.write_text(
        "arguments:\n"
        "  kind: {default: a}\n"
        "  vendor_kind: {alias_of: kind}\n"
        "  mode: {default: $(arg derived_mode)}\n"
        "variables:\n"
        "  derived_mode: {value: $(arg kind), choices: {a: fast, b: slow}, message: why}\n"
        "remappings: {/x: /$(arg mode)/x}\n"
        "nodes:\n"
        "  - {name: n, executable: e, parameters: {mode: $(arg mode)}, remappings: {/y: /z}}\n"
        "  - {name: m, executable: e, remappings: {/x: /own}}\n"
    )
    n, m = resolve_stack(stack).nodes
    assert n.parameters["mode"] == "fast" and n.remappings == (("/y", "/z"), ("/x", "/fast/x"))
    assert m.remappings == (("/x", "/own"),)  # a node's own remap wins
    assert resolve_stack(stack, {"vendor_kind": "b"}).nodes[0].parameters["mode"] == "slow"
    assert resolve_stack(stack, {"kind": "b", "mode": "x"}).nodes[0].parameters["mode"] == "x"
    with pytest.raises(StackError, match=r"kind must be one of \['a', 'b'\], got 'c' \(why\)"):
        resolve_stack(stack, {"vendor_kind": "c"})
    with pytest.raises(StackError, match="kind:=a and vendor_kind:=b disagree"):
        resolve_stack(stack, {"kind": "a", "vendor_kind": "b"})
    stack.write_text(
        "arguments: {p: {default: ''}}\n"
        "variables: {prefix: {value: $(arg p), choices: {'': ''}, otherwise: $(arg p)_}}\n"
        "refuse: [{unless: 'p =~ [a-z]*', message: lower-case letters only}]\n"
        "nodes: [{name: n, executable: e, parameters: {prefix: $(arg prefix)}}]\n"
    )
    assert resolve_stack(stack).nodes[0].parameters["prefix"] == ""
    assert resolve_stack(stack, {"p": "left"}).nodes[0].parameters["prefix"] == "left_"
    with pytest.raises(StackError, match="with p:=Left: lower-case letters only"):
        resolve_stack(stack, {"p": "Left"})
    stack.write_text("arguments: {v: {alias_of: w}}\nnodes: [{name: n, executable: e}]\n")
    with pytest.raises(StackError, match="alias of 'w'"):
        resolve_stack(stack)
