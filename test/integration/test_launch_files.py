"""launch/*.launch.py are real ROS 2 launch files fed by the same stack files as
`vla-runtime launch`. Runs only where the `launch` and `launch_ros` packages import (a full ROS 2
install); pip-only hosts skip it."""

from pathlib import Path

import pytest

launch = pytest.importorskip("launch")
pytest.importorskip("launch_ros")

from launch.actions import OpaqueFunction  # noqa: E402
from launch.launch_description_sources import (  # noqa: E402
    get_launch_description_from_python_launch_file,
)
from launch_ros.actions import Node  # noqa: E402

from vla_runtime.stack.resolver import coerce_scalar, resolve_stack  # noqa: E402

LAUNCH_DIR = Path(__file__).resolve().parents[2] / "launch"


@pytest.mark.launch
@pytest.mark.parametrize(
    "stack, arguments",
    [
        ("sim", {}),
        ("sim", {"policy": "true"}),
        ("franka", {}),
        ("franka", {"use_sim": "true"}),
        ("ur", {}),
        ("ur", {"use_sim": "true"}),
        # the vendors' argument names (docs/bringup.md)
        ("franka", {"use_fake_hardware": "true", "load_gripper": "true", "arm_id": "fr3"}),
        ("franka", {"policy": "true", "checkpoint": "c", "namespace": "left"}),
        (
            "ur",
            {
                "use_mock_hardware": "true",
                "initial_joint_controller": "joint_trajectory_controller",
            },
        ),
        ("ur", {"launch_rviz": "true"}),
        ("ur", {"direct": "true", "robot_ip": "192.168.1.10", "servo_lookahead_s": "0.1",
                "servo_gain": "300"}),
        ("ur", {"direct": "true", "robot_ip": "192.168.1.10", "ur_type": "ur10e"}),
        ("ur", {"ur_type": "ur20", "camera_source": "file", "scene_device": "scene.avi"}),
    ],
)  # fmt: skip
def test_launch_file_starts_the_stack_nodes(stack, arguments):
    description = get_launch_description_from_python_launch_file(
        str(LAUNCH_DIR / f"{stack}.launch.py")
    )
    declared = {a.name for a in description.get_launch_arguments()}
    expected = resolve_stack(stack, {k: coerce_scalar(v) for k, v in arguments.items()})
    context = launch.LaunchContext()
    for action in description.entities:
        if not isinstance(action, OpaqueFunction):
            action.visit(context)  # DeclareLaunchArgument sets the defaults
    for key, value in arguments.items():
        context.launch_configurations[key] = value
    opaque = next(a for a in description.entities if isinstance(a, OpaqueFunction))
    nodes = [n for n in opaque.execute(context) if isinstance(n, Node)]
    assert declared >= set(arguments)
    assert [n.node_executable for n in nodes] == [n.executable for n in expected.nodes]
    assert len(nodes) == len(expected.nodes)
