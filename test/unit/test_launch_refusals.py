"""`vla-runtime launch` refuses a policy without a checkpoint on a real arm before starting
anything (one line, exit 2); in simulation it only warns."""

from __future__ import annotations

import pytest

from vla_runtime.cli import main


def test_checkpoint_less_policy_is_refused_on_a_real_arm(capsys):
    assert main(["launch", "franka", "policy:=true", "robot_ip:=172.16.0.2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without checkpoint:=DIR would drive a real arm" in err[0]
    assert main(["launch", "ur", "policy:=true"]) == 2


@pytest.mark.parametrize(
    "arguments, reason",
    [
        (["franka", "arm_id:=fer", "robot_type:=fr3"], "disagree (both set robot_type)"),
        (["franka", "robot_type:=fp3"], "no FP3 description"),
        (["franka", "arm_id:=fr3v2"], "no FR3v2 description"),
        (["franka", "use_fake_hardware:=true", "arm_id:=fer"], "models only the FR3"),
        (["franka", "fake_sensor_commands:=true"], "only with fake hardware"),
        (["franka", "franky_sim:=true"], "add direct:=true"),
        (["franka", "franky_sim:=true", "direct:=true", "use_sim:=true"], "choose one"),
        (["franka", "franky_sim:=true", "direct:=true", "franky_sim_ip:=10.0.0.2"], "loopback"),
        (["franka", "arm_prefix:=left-arm"], "arm_prefix must be a ROS name fragment"),
        (["franka", "namespace:=2arms"], "is no ROS namespace"),
        (["ur", "mock_sensor_commands:=true"], "only with mock hardware"),
        (["ur", "servo_feedforward:=true"], "sets the simulated arm's servo"),
        (
            ["ur", "initial_joint_controller:=forward_velocity_controller"],
            "streams joint positions",
        ),
        (["ur", "tf_prefix:=left/"], "tf_prefix must be a ROS name fragment"),
        (["ur", "use_mock_hardware:=true", "use_sim:=false"], "disagree (both set use_sim)"),
        (["ur", "--sim", "ur_type:=ur10e"], "the simulator models only the UR5e"),
        (["ur", "use_mock_hardware:=true", "ur_type:=ur20"], "the simulator models only the UR5e"),
        (["ur", "ur_type:=ur5"], "ur_type must be one of"),
        (["ur", "direct:=true", "servo_gain:=stiff"], "servo_gain: expected a number, got 'stiff'"),
    ],
)
def test_vendor_arguments_that_cannot_run_are_refused_in_one_line(capsys, arguments, reason):
    assert main(["launch", *arguments]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: stack ") and reason in err[0]
