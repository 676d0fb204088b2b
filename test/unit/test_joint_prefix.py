"""A joint prefix (franka_bringup's arm_prefix, ur_robot_driver's tf_prefix) names the robot's
joints on ROS: `load_robot` prefixes the arm and gripper joints and nothing else, the sim
driver's mapping strips it again and refuses names without it, and the engine's state mapping
reads the prefixed joints."""

from __future__ import annotations

import pytest

from vla_runtime.core.robot import load_robot, prefixed, unprefixed
from vla_runtime.engine.state_mapping import StateMapping


@pytest.mark.parametrize("robot", ["fr3", "panda", "ur5e"])
def test_load_robot_prefixes_the_joint_names_only(robot):
    plain, left = load_robot(robot), load_robot(robot, "left_")
    assert left.joints == tuple(f"left_{j}" for j in plain.joints)
    assert left.gripper_joints == tuple(f"left_{j}" for j in plain.gripper_joints)
    others = {k: v for k, v in vars(left).items() if k not in ("joints", "gripper_joints")}
    assert others == {k: v for k, v in vars(plain).items() if k not in ("joints", "gripper_joints")}
    assert load_robot(robot, "") == plain


def test_load_robot_names_the_franka_and_ur_joints_as_their_drivers_do():
    # franka_description joins arm_prefix:=left with "_"; the stack passes "left_".
    assert load_robot("fr3", "left_").joints[0] == "left_fr3_joint1"
    assert load_robot("fr3", "left_").gripper_joints[0] == "left_fr3_finger_joint1"
    assert load_robot("ur5e", "left_").joints[0] == "left_shoulder_pan_joint"


@pytest.mark.parametrize("prefix", ["left-", "2arms_", "a/b", "left arm"])
def test_a_prefix_that_is_no_ros_name_fragment_is_refused(prefix):
    with pytest.raises(ValueError, match="is no ROS name fragment"):
        load_robot("fr3", prefix)


def test_unprefixed_maps_ros_names_back_and_refuses_names_without_the_prefix():
    names = prefixed(["fr3_joint2", "fr3_joint1"], "left_")
    assert names == ("left_fr3_joint2", "left_fr3_joint1")
    assert unprefixed(names, "left_") == ["fr3_joint2", "fr3_joint1"]
    assert unprefixed(["fr3_joint1"], "") == ["fr3_joint1"]
    with pytest.raises(ValueError, match=r"\['fr3_joint1', 'right_fr3_joint2'\] lack the prefix"):
        unprefixed(["left_fr3_joint3", "fr3_joint1", "right_fr3_joint2"], "left_")


def test_the_engine_state_mapping_reads_the_prefixed_joints():
    mapping = StateMapping.for_robot("fr3", joint_prefix="left_")
    assert mapping.joint_names == [*(f"left_fr3_joint{i}" for i in range(1, 8)),
                                   "left_fr3_finger_joint1"]  # fmt: skip
    names = [*mapping.arm_joints, *mapping.gripper_joints]
    state = mapping.state_from(names, [0.1 * i for i in range(9)])
    assert state.tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7 + 0.8])
