"""`ros2 launch vla_runtime gazebo.launch.py`: Gazebo (gz sim) in place of the MuJoCo driver,
then config/stacks/gazebo.yaml's nodes (the policy pipeline) with policy:=true.

The URDF, world, controllers and bridge files are generated at launch (sim/description.py) into
a fresh folder; gz sim loads the world, ros_gz_sim's `create` spawns the robot from
robot_state_publisher's description (gz_ros2_control reads its controllers from there), the
bridge carries /clock and the cameras, and the spawners start the joint state broadcaster, the
arm controller the gate drives (the other one loaded inactive) and the gripper controller.
Needs ros_gz, gz_ros2_control and ros2_controllers (the Docker image has them).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import IncludeLaunchDescription, OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch_ros.actions import Node

from vla_runtime.core.robot import load_robot
from vla_runtime.sim.description import WORLD_NAME, write_gazebo_files
from vla_runtime.sim.workcell import SceneConfig
from vla_runtime.stack.launch_support import declared_arguments, given_arguments, stack_nodes
from vla_runtime.stack.resolver import coerce_scalar, parse_bool, resolve_stack

STACK = "gazebo"


def gazebo_launch_description() -> LaunchDescription:
    actions, declared, defaults = declared_arguments(STACK)

    def start(context, *_args, **_kwargs):
        given = given_arguments(context, declared, defaults)
        values = {
            name: coerce_scalar(context.launch_configurations.get(name, defaults[name]))
            for name in declared
        }
        policy = parse_bool(values["policy"], "policy")
        # Resolving refuses a robot without a description before gz starts.
        stack = resolve_stack(STACK, {**given, "policy": True})
        # The gz cameras render at the size the stack's policy takes (its checkpoint's, the one
        # for the tracking servo the stack's variables name).
        image_size = stack.values["image_size"] if policy else values["image_size"]
        gazebo = gazebo_actions(
            robot=str(values["robot"]),
            seed=int(values["seed"]),
            n_cubes=int(values["n_cubes"]),
            image_size=int(image_size),
            camera_fps=float(values["camera_fps"]),
            command_interface=str(values["command_interface"]),
            gui=parse_bool(values["gui"], "gui"),
        )
        return gazebo + (stack_nodes(STACK, given) if policy else [])

    actions.append(OpaqueFunction(function=start))
    return LaunchDescription(actions)


def gazebo_actions(
    robot: str,
    seed: int,
    n_cubes: int,
    image_size: int,
    camera_fps: float,
    command_interface: str,
    gui: bool,
) -> list:
    folder = Path(tempfile.mkdtemp(prefix="vla_gazebo_"))
    files = write_gazebo_files(
        folder, SceneConfig(robot=robot, seed=seed, n_cubes=n_cubes), image_size, camera_fps
    )
    config = load_robot(robot)
    gz_args = f"-r {'' if gui else '-s --headless-rendering '}{files.world}"
    gz_sim = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            str(Path(get_package_share_directory("ros_gz_sim")) / "launch" / "gz_sim.launch.py")
        ),
        launch_arguments={"gz_args": gz_args, "on_exit_shutdown": "true"}.items(),
    )
    state_publisher = Node(
        package="robot_state_publisher",
        executable="robot_state_publisher",
        parameters=[{"robot_description": files.urdf.read_text(), "use_sim_time": True}],
        output="screen",
    )
    spawn = Node(
        package="ros_gz_sim",
        executable="create",
        arguments=["-world", WORLD_NAME, "-topic", "robot_description", "-name", robot],
        output="screen",
    )
    bridge = Node(
        package="ros_gz_bridge",
        executable="parameter_bridge",
        parameters=[{"config_file": str(files.bridge), "use_sim_time": True}],
        output="screen",
    )
    # The gate drives one arm controller; both claim the joints' position commands.
    arm = command_interface
    idle = {"trajectory": "forward_position", "forward_position": "trajectory"}[arm]
    spawner_args = ["--param-file", str(files.controllers)]
    active = Node(
        package="controller_manager",
        executable="spawner",
        arguments=["joint_state_broadcaster", config.controller(arm), config.controller("gripper"),
                   *spawner_args],
    )  # fmt: skip
    inactive = Node(
        package="controller_manager",
        executable="spawner",
        arguments=[config.controller(idle), "--inactive", *spawner_args],
    )
    # The controller manager lives in the spawned robot (gz_ros2_control): spawn it first.
    after_spawn = RegisterEventHandler(
        OnProcessExit(target_action=spawn, on_exit=[active, inactive])
    )
    return [gz_sim, state_publisher, spawn, bridge, after_spawn]
