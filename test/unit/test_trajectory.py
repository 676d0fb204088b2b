import math

import numpy as np
import pytest

from vla_runtime.core.trajectory import (
    TrajectoryRejected,
    TrajectorySampler,
    column_order,
    validate_trajectory,
)

ARM = ["j1", "j2"]
FINGER = ["f"]
LOWER = [-1.0, -2.0, 0.0]
UPPER = [1.0, 2.0, 0.04]


def check(names=ARM, positions=((0.1, 0.2),), velocities=None, accelerations=None, times=(0.5,)):
    return validate_trajectory(
        names, positions, velocities, accelerations, times, ARM, FINGER, LOWER, UPPER
    )


def test_valid_trajectories_pass():
    assert check() is None
    assert check(names=["j2", "j1"], positions=[(1.5, 0.9)]) is None
    assert check(names=["j1", "j2", "f"], positions=[(0.0, 0.0, 0.04)]) is None
    assert check(positions=[(0, 0), (1, 2)], times=[0.0, 1.0], velocities=[(), (0, 0)]) is None
    assert check(velocities=[(1.0, 1.0)], accelerations=[(0.0, 0.0)]) is None


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"names": ["j1"], "positions": [(0.0,)]}, "missing ['j2']"),
        ({"names": ["j1", "j2", "x"], "positions": [(0, 0, 0)]}, "unknown ['x']"),
        ({"names": ["j1", "j2", "j2"], "positions": [(0, 0, 0)]}, "duplicated ['j2']"),
        ({"positions": []}, "no points"),
        ({"positions": [(0.1,)]}, "point 0: 1 positions for 2 joints"),
        ({"times": (0.5, 1.0)}, "2 times for 1 points"),
        ({"positions": [(math.nan, 0.0)]}, "non-finite positions"),
        ({"velocities": [(0.0, math.inf)]}, "non-finite velocities"),
        ({"velocities": [(0.0,)]}, "1 velocities for 2 joints"),
        ({"velocities": [(), ()]}, "2 velocities entries for 1 points"),
        ({"accelerations": [(0.0, 0.0)]}, "accelerations without velocities"),
        ({"positions": [(1.01, 0.0)]}, "j1 = 1.01 outside [-1.0, 1.0]"),
        ({"names": ["j2", "j1"], "positions": [(0.0, -1.5)]}, "j1 = -1.5 outside"),
        ({"names": ["j1", "j2", "f"], "positions": [(0, 0, 0.05)]}, "f = 0.05 outside"),
        ({"times": (-0.1,)}, "must be finite and >= 0"),
        ({"times": (math.nan,)}, "must be finite and >= 0"),
        ({"positions": [(0, 0), (0, 0)], "times": (0.5, 0.5)}, "0.5 not after 0.5"),
    ],
)
def test_bad_trajectories_give_reasons(kwargs, fragment):
    reason = check(**kwargs)
    assert reason is not None and fragment in reason, reason


def test_column_order_maps_names_to_controller_order():
    assert column_order(["j2", "f", "j1"], ["j1", "j2", "f"]) == [2, 0, 1]
    assert column_order(["j2", "j1"], ["j1", "j2", "f"]) == [1, 0]


def test_linear_with_positions_only():
    s = TrajectorySampler(10.0, [0.0], [1.0, 2.0], [[1.0], [3.0]], now=10.0)
    p, v, a = s.sample(9.0)  # before the start: hold the start setpoint
    assert p.tolist() == [0.0] and v.tolist() == [0.0]
    p, v, a = s.sample(10.5)
    assert p == pytest.approx([0.5], abs=1e-12) and v == pytest.approx([1.0])
    p, v, a = s.sample(11.5)
    assert p == pytest.approx([2.0], abs=1e-12) and v == pytest.approx([2.0])
    assert a.tolist() == [0.0]
    p, v, a = s.sample(12.5)  # after the end: hold the last point
    assert p.tolist() == [3.0] and v.tolist() == [0.0]
    assert not s.done(11.999) and s.done(12.0)


def test_cubic_hermite_with_velocities():
    s = TrajectorySampler(0.0, [0.0], [1.0], [[1.0]], velocities=[[0.0]], start_velocities=[0.0])
    p, v, a = s.sample(0.5)  # 3s^2 - 2s^3
    assert p == pytest.approx([0.5]) and v == pytest.approx([1.5]) and a == pytest.approx([0.0])
    p, v, a = s.sample(0.25)
    assert p == pytest.approx([0.15625]) and v == pytest.approx([1.125])
    # End velocity is honoured: just before the end the slope equals the point's velocity.
    s = TrajectorySampler(0.0, [0.0], [2.0], [[1.0]], velocities=[[0.7]], start_velocities=[0.3])
    assert s.sample(0.0)[1] == pytest.approx([0.3])
    assert s.sample(2.0 - 1e-9)[1] == pytest.approx([0.7], abs=1e-6)
    assert s.sample(2.0 - 1e-9)[0] == pytest.approx([1.0], abs=1e-6)


def test_quintic_with_accelerations():
    s = TrajectorySampler(
        0.0,
        [0.0],
        [1.0],
        [[1.0]],
        velocities=[[0.0]],
        accelerations=[[0.0]],
        start_velocities=[0.0],
        start_accelerations=[0.0],
    )  # 10s^3 - 15s^4 + 6s^5
    p, v, a = s.sample(0.5)
    assert p == pytest.approx([0.5]) and v == pytest.approx([1.875]) and a == pytest.approx([0.0])
    p, v, a = s.sample(0.25)
    assert p == pytest.approx([0.103515625])
    assert v == pytest.approx([30 * 0.25**2 - 60 * 0.25**3 + 30 * 0.25**4])
    assert a == pytest.approx([60 * 0.25 - 180 * 0.25**2 + 120 * 0.25**3])


def test_segment_degree_follows_both_ends():
    # Start carries a velocity but the point does not: the segment is linear (like JTC).
    s = TrajectorySampler(0.0, [0.0], [1.0], [[2.0]], start_velocities=[5.0])
    p, v, _ = s.sample(0.25)
    assert p == pytest.approx([0.5]) and v == pytest.approx([2.0])


def test_multi_joint_and_first_point_at_zero():
    s = TrajectorySampler(1.0, [0.0, 0.0], [0.0, 1.0], [[1.0, -1.0], [2.0, -3.0]], now=1.0)
    p, v, _ = s.sample(1.0)  # the first point is reached at once
    assert p == pytest.approx([1.0, -1.0])
    p, v, _ = s.sample(1.5)
    assert p == pytest.approx([1.5, -2.0]) and v == pytest.approx([1.0, -2.0])


def test_trajectory_ending_in_the_past_is_rejected():
    with pytest.raises(TrajectoryRejected, match="already past"):
        TrajectorySampler(0.0, [0.0], [1.0], [[1.0]], now=1.001)
    assert TrajectorySampler(0.0, [0.0], [1.0], [[1.0]], now=1.0).end_time == 1.0


def test_start_shape_must_match():
    with pytest.raises(ValueError, match="joints"):
        TrajectorySampler(0.0, [0.0, 0.0, 0.0], [1.0], np.zeros((1, 2)))


def test_position_matches_sample():
    s = TrajectorySampler(
        0.0, [0.0, 1.0], [0.5, 1.5], [[1.0, 0.0], [0.5, 2.0]], velocities=[[1.0, 0.0], [0.0, 0.0]]
    )
    for t in (-1.0, 0.0, 0.2, 0.5, 0.9, 1.5, 3.0):
        np.testing.assert_array_equal(s.position(t), s.sample(t)[0])
