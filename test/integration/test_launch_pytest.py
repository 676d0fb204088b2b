"""The launch files run: `sim.launch.py` publishes /joint_states; `gazebo.launch.py` publishes
/joint_states and camera images from Gazebo. Written against launch_pytest, so they run where it
imports (the Docker image, with ros_gz for the Gazebo ones); everywhere else they are skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

launch_pytest = pytest.importorskip(
    "launch_pytest", reason="launch_pytest is not installed (ROS 2's ros-jazzy-launch-pytest)"
)
rclpy = pytest.importorskip("rclpy", reason="rclpy is not installed")

from ament_index_python.packages import (  # noqa: E402
    PackageNotFoundError,
    get_package_share_directory,
)
from launch import LaunchDescription  # noqa: E402
from launch.actions import IncludeLaunchDescription  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402
from rclpy.wait_for_message import wait_for_message  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402

from vla_runtime.core import topics  # noqa: E402
from vla_runtime.core.robot import load_robot  # noqa: E402

LAUNCH_DIR = Path(__file__).resolve().parents[2] / "launch"
SIM_START_S = 60.0  # MuJoCo compile, camera processes
GAZEBO_START_S = 180.0  # gz sim, the spawn, controller spawners, first rendered frames


def installed(package: str) -> bool:
    try:
        get_package_share_directory(package)
    except PackageNotFoundError:
        return False
    return True


needs_gazebo = pytest.mark.skipif(
    not all(map(installed, ("ros_gz_sim", "ros_gz_bridge", "gz_ros2_control"))),
    reason="ros_gz_sim, ros_gz_bridge or gz_ros2_control is not installed",
)


def launched(name: str, **arguments: str) -> LaunchDescription:
    include = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(LAUNCH_DIR / name)),
        launch_arguments=arguments.items(),
    )
    return LaunchDescription([include, launch_pytest.actions.ReadyToTest()])


@launch_pytest.fixture
def sim_launch():
    return launched("sim.launch.py")


@launch_pytest.fixture
def gazebo_fr3_launch():
    return launched("gazebo.launch.py", robot="fr3")


@launch_pytest.fixture
def gazebo_ur5e_launch():
    return launched("gazebo.launch.py", robot="ur5e")


@pytest.fixture
def probe():
    rclpy.init()
    node = rclpy.create_node("launch_pytest_probe")
    yield node
    node.destroy_node()
    rclpy.shutdown()


def received(node, message_type, topic: str, timeout_s: float):
    """The first message on `topic` within `timeout_s`, or None."""
    ok, message = wait_for_message(message_type, node, topic, time_to_wait=timeout_s)
    return message if ok else None


def check_joint_states(node, robot: str, timeout_s: float) -> None:
    message = received(node, JointState, topics.JOINT_STATES, timeout_s)
    assert message is not None, f"no {topics.JOINT_STATES} within {timeout_s} s"
    assert set(load_robot(robot).joints) <= set(message.name)


def check_images(node, timeout_s: float) -> None:
    for camera in ("scene", "wrist"):
        image = received(node, Image, topics.camera_image(camera), timeout_s)
        assert image is not None, f"no {topics.camera_image(camera)} within {timeout_s} s"
        assert image.width > 0 and image.height > 0 and len(image.data) > 0


@pytest.mark.launch(fixture=sim_launch)
def test_sim_launch_publishes_joint_states(probe):
    check_joint_states(probe, "fr3", SIM_START_S)


@needs_gazebo
@pytest.mark.launch(fixture=gazebo_fr3_launch)
def test_gazebo_launch_publishes_fr3_joint_states_and_images(probe):
    check_joint_states(probe, "fr3", GAZEBO_START_S)
    check_images(probe, GAZEBO_START_S)


@needs_gazebo
@pytest.mark.launch(fixture=gazebo_ur5e_launch)
def test_gazebo_launch_publishes_ur5e_joint_states_and_images(probe):
    check_joint_states(probe, "ur5e", GAZEBO_START_S)
    check_images(probe, GAZEBO_START_S)
