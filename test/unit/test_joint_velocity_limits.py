"""Joint velocity limit models against the numbers libfranka's formulas give."""

import math

import numpy as np
import pytest

from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.joint_velocity_limits import (
    FR3_VELOCITY_TOLERANCE,
    velocity_limits,
)

HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


def test_fr3_joint2_near_its_upper_end():
    q = HOME.copy()
    q[1] = 1.40
    lower, upper = velocity_limits("libfranka_fr3", q)
    # -0.20 + sqrt(5.17 (1.7918 - 1.40)) - 0.001
    assert upper[1] == pytest.approx(-0.20 + math.sqrt(5.17 * 0.3918) - 0.001, abs=1e-9)
    assert upper[1] == pytest.approx(1.223, abs=1e-3)
    assert lower[1] == pytest.approx(-2.62 + FR3_VELOCITY_TOLERANCE)  # far from the lower end
    assert upper[0] == pytest.approx(2.619)


def test_fr3_lower_limits_shrink_toward_the_lower_end():
    q = HOME.copy()
    q[5] = 0.60  # joint 6's lower end sits at 0.54092
    lower, upper = velocity_limits("libfranka_fr3", q)
    assert lower[5] == pytest.approx(0.35 - math.sqrt(11.0 * (0.60 - 0.54092)) + 0.001)
    assert -0.5 < lower[5] < 0.0
    assert upper[5] == pytest.approx(4.179)


def test_fr3_limits_are_zero_past_the_ends_and_never_change_sign():
    q = np.array([2.76, 1.80, 2.91, -0.1, 2.82, 4.53, 3.02])
    lower, upper = velocity_limits("libfranka_fr3", q)
    assert np.all(upper == 0.0)
    assert np.all(lower < 0.0)
    lower, upper = velocity_limits("libfranka_fr3", -np.abs(q) - [0, 0, 0, 3.0, 0, -4.0, 0])
    assert np.all(lower <= 0.0) and np.all(upper >= 0.0)


def test_fr3_vectorised_over_leading_axes():
    qs = np.stack([HOME, HOME + 0.5, HOME - 0.3])
    lower, upper = velocity_limits("libfranka_fr3", qs)
    assert lower.shape == upper.shape == (3, 7)
    for row, q in enumerate(qs):
        lo, up = velocity_limits("libfranka_fr3", q)
        np.testing.assert_array_equal(upper[row], up)
        np.testing.assert_array_equal(lower[row], lo)


def test_fer_limits_are_flat_with_three_lost_packets():
    lower, upper = velocity_limits("libfranka_fer", HOME)
    # 2.175 - 0.001 - 3 * 0.001 * (15.0 - 0.001) for joint 1
    assert upper[0] == pytest.approx(2.129003, abs=1e-9)
    assert upper[4] == pytest.approx(2.61 - 0.001 - 0.003 * 14.999, abs=1e-9)
    np.testing.assert_array_equal(lower, -upper)
    _, near_end = velocity_limits("libfranka_fer", HOME + [0, 1.7, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(near_end, upper)


def test_unknown_model_and_wrong_shape_are_value_errors():
    with pytest.raises(ValueError, match="unknown velocity limit model"):
        velocity_limits("ur5e", HOME)
    with pytest.raises(ValueError, match="7 joints"):
        velocity_limits("libfranka_fr3", np.zeros(6))


def test_robot_descriptions_select_their_model():
    assert load_robot("fr3").velocity_limits == "libfranka_fr3"
    assert load_robot("panda").velocity_limits == "libfranka_fer"
    assert load_robot("ur5e").velocity_limits is None
