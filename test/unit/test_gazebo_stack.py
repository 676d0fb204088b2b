"""config/stacks/gazebo.yaml resolves here and lines up with the MuJoCo sim stack: the same
pipeline parameters as on its tracking servo, and every topic the pipeline uses is one Gazebo's
side provides (the bridge's clock and cameras, the controllers' command topics, the joint state
broadcaster).
Running it needs gz and ros_gz (the Docker image: test/integration/test_launch_pytest.py)."""

from __future__ import annotations

import pytest

from vla_runtime.core import topics
from vla_runtime.core.robot import load_robot
from vla_runtime.sim.description import bridge_config, controllers_config
from vla_runtime.sim.workcell import SceneConfig
from vla_runtime.stack.resolver import StackError, resolve_stack

PIPELINE = ("engine", "safety", "streamer")
MUJOCO_DRIVER_TOPICS = {topics.DRIVER_EVENTS, topics.EPISODE}  # the MuJoCo task driver's own


@pytest.mark.parametrize("robot", ["fr3", "ur5e"])
@pytest.mark.parametrize("command_interface", ["trajectory", "forward_position"])
def test_gazebo_pipeline_is_the_sim_stacks(robot, command_interface):
    arguments = {"policy": True, "robot": robot, "command_interface": command_interface}
    gazebo = resolve_stack("gazebo", arguments)
    # Gazebo's controllers track their setpoints, as the MuJoCo arm's tracking servo does; the
    # delay from setpoint to motion is calibrated per simulator (MuJoCo's only, so far).
    tracking = {"servo_feedforward": True, "driver_delay_s": 0.0}
    sim = resolve_stack("sim", {**arguments, **tracking})
    gazebo_nodes = {n.name: n for n in gazebo.nodes}
    sim_nodes = {n.name: n for n in sim.nodes}
    assert list(gazebo_nodes) == list(PIPELINE)
    for name in PIPELINE:
        assert gazebo_nodes[name].parameters == sim_nodes[name].parameters, name
        assert gazebo_nodes[name].remappings == sim_nodes[name].remappings, name
    assert gazebo.use_sim_time
    assert set(sim.report_topics) - MUJOCO_DRIVER_TOPICS <= set(gazebo.report_topics)


@pytest.mark.parametrize("robot", ["fr3", "ur5e"])
def test_gazebo_side_provides_every_topic_the_pipeline_uses(robot):
    config = load_robot(robot)
    stack = resolve_stack("gazebo", {"policy": True, "robot": robot})
    bridged = {entry["ros_topic_name"] for entry in bridge_config(SceneConfig(robot=robot))}
    engine = next(n for n in stack.nodes if n.name == "engine")
    for camera in engine.parameters["cameras"]:
        assert {topics.camera_image(camera), topics.camera_info(camera)} <= bridged
    assert topics.CLOCK in bridged
    controllers = controllers_config(robot)["/**"]["controller_manager"]["ros__parameters"]
    assert "joint_state_broadcaster" in controllers  # /joint_states
    # The safety gate publishes to these controllers (nodes/safety.py).
    for key in ("trajectory", "forward_position", "gripper"):
        assert config.controller(key) in controllers
    assert topics.trajectory_command(config.controller("trajectory")) in stack.report_topics


def test_gazebo_stack_refusals():
    with pytest.raises(StackError, match="starts no node"):
        resolve_stack("gazebo", {})  # the launch file starts Gazebo alone then
    with pytest.raises(StackError, match="robot:=fr3 or ur5e"):
        resolve_stack("gazebo", {"policy": True, "robot": "panda"})
