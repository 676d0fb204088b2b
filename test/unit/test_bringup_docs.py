"""The runtime commands of docs/bringup.md resolve as written (placeholders filled in) to what
the doc says (the UR servo gain, UR types, video-file cameras), and the franka_bringup command
there loads the gripper."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from vla_runtime.core.robot import load_robot
from vla_runtime.stack.resolver import Stack, coerce_scalar, resolve_stack

DOC = Path(__file__).resolve().parents[2] / "docs" / "bringup.md"
PLACEHOLDERS = {"<FCI address>": "172.16.0.2", "<robot address>": "192.168.1.10",
                "<address>": "127.0.0.1", "<dir>": "checkpoints/vla_tiny_sim"}  # fmt: skip


def shell_commands() -> list[str]:
    """The commands of the doc's bash blocks, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    text = "\n".join(re.sub(r"\\\n\s*", " ", block) for block in blocks)
    commands = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    for placeholder, value in PLACEHOLDERS.items():
        commands = [c.replace(placeholder, value) for c in commands]
    return [c for c in commands if c]


def runtime_commands() -> list[str]:
    return [
        c for c in shell_commands()
        if c.startswith("vla-runtime launch ") or c.startswith("ros2 launch vla_runtime ")
    ]  # fmt: skip


def resolved(command: str) -> Stack:
    """The stack `command` starts, its arguments typed as the launchers type them."""
    words = shlex.split(command)
    at = (
        3 if words[0] == "ros2" else 2
    )  # ros2 launch vla_runtime STACK.launch.py | vla-runtime launch STACK
    stack = words[at].removesuffix(".launch.py")
    overrides = dict(w.split(":=", 1) for w in words[at + 1 :] if ":=" in w)
    if "--sim" in words:
        overrides["use_sim"] = "true"
    return resolve_stack(stack, {k: coerce_scalar(v) for k, v in overrides.items()})


@pytest.mark.parametrize("command", runtime_commands())
def test_runtime_command_resolves(command):
    assert resolved(command).nodes


def test_the_ur_commands_start_the_documented_driver_robot_and_cameras():
    commands = runtime_commands()
    servo = [c for c in commands if "servo_gain:=300 " in c + " "]
    assert len(servo) == 1
    driver = {n.name: n for n in resolved(servo[0]).nodes}["ur_driver"].parameters
    assert type(driver["servo_gain"]) is float and driver["servo_gain"] == 300.0
    assert driver["servo_lookahead_s"] == 0.1
    ur10e = [c for c in commands if "ur_type:=ur10e" in c]
    assert len(ur10e) >= 2 and any("direct:=true" in c for c in ur10e)
    for command in ur10e:
        nodes = resolved(command).nodes
        assert {n.parameters["robot"] for n in nodes if "robot" in n.parameters} == {"ur10e"}
    plain = next(c for c in ur10e if "initial_joint_controller:=joint_trajectory_controller" in c)
    safety = {n.name: n for n in resolved(plain).nodes}["safety"]
    assert ("/scaled_joint_trajectory_controller/joint_trajectory",
            "/joint_trajectory_controller/joint_trajectory") in safety.remappings  # fmt: skip
    dry_run = next(c for c in commands if c.startswith("vla-runtime launch ur ")
                   and "camera_source:=file" in c)  # fmt: skip
    cameras = [n.parameters for n in resolved(dry_run).nodes if n.executable == "vla-camera"]
    assert [(c["source"], c["path"]) for c in cameras] == [("file", "scene.avi"),
                                                           ("file", "wrist.avi")]  # fmt: skip


def test_the_doc_runs_the_vendor_argument_commands_and_loads_the_gripper():
    commands = shell_commands()
    assert len(runtime_commands()) >= 8
    franka_bringup = [c for c in commands if c.startswith("ros2 launch franka_bringup")]
    assert franka_bringup and all("load_gripper:=true" in c for c in franka_bringup)
    assert "vla-runtime launch franka use_fake_hardware:=true load_gripper:=true arm_id:=fr3" in (
        commands
    )
    assert (
        "vla-runtime launch ur use_mock_hardware:=true ur_type:=ur5e "
        "initial_joint_controller:=joint_trajectory_controller"
    ) in commands


def test_controller_yaml_reaches_namespaced_controller_managers():
    """franka_jtc.yaml keys its nodes under `/**` (any namespace), one key only, with the
    controller and joints config/robots/fr3.yaml expects."""
    path = DOC.parents[1] / "config" / "controllers" / "franka_jtc.yaml"
    nodes = yaml.safe_load(path.read_text())
    assert list(nodes) == ["/**"]  # and once in the text: YAML keeps the last of duplicates
    fr3 = load_robot("fr3")
    controller = fr3.controllers["trajectory"]
    manager = nodes["/**"]["controller_manager"]["ros__parameters"]
    assert manager[controller]["type"] == "joint_trajectory_controller/JointTrajectoryController"
    assert nodes["/**"][controller]["ros__parameters"]["joints"] == list(fr3.joints)
    assert path.read_text().count("\n/**:") == 1
