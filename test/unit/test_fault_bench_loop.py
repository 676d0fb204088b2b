"""The fault bench's loop is the robot's sim stack: on the tracking servo its streamer leads as
`vla-runtime launch sim|ur servo_feedforward:=true` does."""

from __future__ import annotations

import pytest

from vla_runtime.bench.faults import bench_nodes


def settings(robot: str, servo_feedforward: bool) -> dict:
    return {"robot": robot, "image_size": 64, "camera_fps": 10.0, "consequence": "auto",
            "command_interface": "trajectory", "servo_feedforward": servo_feedforward}  # fmt: skip


@pytest.mark.parametrize(("servo_feedforward", "delay", "lead"), [(True, 0.026, True),
                                                                 (False, 0.0, False)])  # fmt: skip
def test_the_fr3_loop_leads_its_commands_as_the_sim_stack_on_that_servo(
    servo_feedforward, delay, lead
):
    nodes = {n.name: n.parameters for n in bench_nodes(settings("fr3", servo_feedforward), "x")}
    assert nodes["sim_driver"]["servo_feedforward"] is servo_feedforward
    assert nodes["streamer"]["driver_delay_s"] == delay
    assert nodes["streamer"]["lead_trajectory_lookahead"] is lead


@pytest.mark.parametrize(("servo_feedforward", "delay"), [(True, 0.026), (False, 0.0)])
def test_the_ur5e_loop_leads_by_the_calibrated_delay_on_the_tracking_servo_only(
    servo_feedforward, delay
):
    nodes = {n.name: n.parameters for n in bench_nodes(settings("ur5e", servo_feedforward), "x")}
    assert nodes["sim_driver"]["servo_feedforward"] is servo_feedforward
    assert nodes["streamer"]["driver_delay_s"] == delay
    # A UR controller reaches each one-point trajectory its lookahead later, real or simulated.
    assert nodes["streamer"]["lead_trajectory_lookahead"] is True
