"""The gripper's one unit: widths (robot configs, gripper commands) <-> one finger's opening."""

import math

import numpy as np
import pytest

from vla_runtime.core.gripper import (
    FINGERS,
    command_refusal,
    max_finger_speed,
    max_opening,
    opening_from_width,
    width_from_opening,
    width_refusal,
)
from vla_runtime.core.robot import load_robot


def test_a_width_is_both_fingers_openings():
    assert FINGERS == 2
    assert opening_from_width(0.08) == pytest.approx(0.04)
    assert width_from_opening(0.0125) == pytest.approx(0.025)
    openings = opening_from_width(np.array([0.0, 0.03, 0.085]))
    np.testing.assert_allclose(openings, [0.0, 0.015, 0.0425])
    np.testing.assert_allclose(width_from_opening(openings), [0.0, 0.03, 0.085])


@pytest.mark.parametrize(
    ("robot", "opening", "speed"), [("fr3", 0.04, 0.05), ("ur5e", 0.0425, 0.075)]
)
def test_the_robot_configs_widths_become_finger_limits(robot, opening, speed):
    config = load_robot(robot)
    assert max_opening(config) == pytest.approx(opening)
    assert max_finger_speed(config) == pytest.approx(speed)


def test_widths_outside_the_gripper_or_not_finite_are_refused():
    assert width_refusal(0.0, 0.08) is None
    assert width_refusal(0.08, 0.08) is None
    assert width_refusal(0.2, 0.08) == "gripper width 0.2 outside [0, 0.08]"
    assert width_refusal(-0.001, 0.08) == "gripper width -0.001 outside [0, 0.08]"
    assert width_refusal(math.inf, 0.08).endswith("is not a finite number")
    assert width_refusal(math.nan, 0.08).endswith("is not a finite number")


def test_a_gripper_command_carries_exactly_one_width():
    assert command_refusal([0.04]) is None
    assert command_refusal([]) == "gripper command needs exactly 1 value (width in m), got 0"
    assert command_refusal([0.01, 0.02]).endswith("got 2")
