"""Jerk-limited tracking (ruckig) under the FR3 limits from config/robots/fr3.yaml."""

import numpy as np
import pytest

from vla_runtime.core.interpolation import JerkLimitedTracker, MotionState, limits_for
from vla_runtime.core.robot import load_robot

DT = 0.004


@pytest.fixture
def limits():
    return limits_for(load_robot("fr3"))


def run(tracker, state, steps, step):
    states = [state]
    for _ in range(steps):
        states.append(step(states[-1]))
    p = np.array([s.position for s in states])
    v = np.array([s.velocity for s in states])
    a = np.array([s.acceleration for s in states])
    return p, v, a


def assert_within(limits, v, a, tolerance=1e-6):
    assert np.all(np.abs(v) <= limits.velocity * (1 + tolerance))
    assert np.all(np.abs(a) <= limits.acceleration * (1 + tolerance))
    # Accelerations of consecutive ticks differ by at most jerk * dt.
    assert np.all(np.abs(np.diff(a, axis=0)) <= limits.jerk * DT * (1 + tolerance) + 1e-9)


def test_limits_from_robot_file(limits):
    assert limits.dof == 8
    assert limits.velocity[:7].tolist() == [2.62, 2.62, 2.62, 2.62, 5.26, 4.18, 5.26]
    assert limits.acceleration[0] == 10.0 and limits.jerk[6] == 5000.0
    # The finger moves at half the gripper's width speed (0.1 m/s).
    assert limits.velocity[7] == pytest.approx(0.05)


def test_feasible_reference_is_tracked_exactly(limits):
    tracker = JerkLimitedTracker(limits)
    t = np.arange(1, 200) * DT
    # A slow sine from rest: every tick's target is reachable within one tick (the finger,
    # with its gentler limits, moves 1 cm).
    omega = 2.0
    amplitude = np.array([0.1] * 7 + [0.01])

    def sine(tk):
        return (
            amplitude * (1 - np.cos(omega * tk)),
            amplitude * omega * np.sin(omega * tk),
            amplitude * omega**2 * np.cos(omega * tk),
        )

    state = MotionState(*sine(0.0))
    for tk in t:
        state = tracker.track(state, sine, tk - DT, DT)
        p, v, _ = sine(tk)
        np.testing.assert_allclose(state.position, p, atol=1e-9)
        np.testing.assert_allclose(state.velocity, v, atol=1e-9)
    assert tracker.failures == 0


def test_step_target_is_reached_within_all_limits(limits):
    tracker = JerkLimitedTracker(limits)
    target = np.array([1.0, -0.5, 0.3, 0.2, 1.5, -1.0, 0.7, 0.04])
    zeros = np.zeros(8)
    p, v, a = run(
        tracker,
        MotionState.at_rest(np.zeros(8)),
        500,
        lambda s: tracker.track(s, lambda t: (target, zeros, zeros), 0.0, DT),
    )
    assert_within(limits, v, a)
    assert np.abs(v).max() > 2.0  # the move is limit-bound, not trivially slow
    np.testing.assert_allclose(p[-1], target, atol=1e-9)
    np.testing.assert_allclose(v[-1], 0.0, atol=1e-9)
    assert tracker.failures == 0


def test_velocity_step_is_rejoined_without_oscillation(limits):
    """A reference that starts moving at 1 rad/s at once (an infinite acceleration): the
    command catches up within the limits, never reverses, then tracks it exactly."""
    tracker = JerkLimitedTracker(limits)
    zeros = np.zeros(8)
    speed = np.array([1.0] * 7 + [0.0])

    def ramp(t):
        return speed * t, speed.copy(), zeros

    states = [MotionState.at_rest(zeros)]
    for k in range(250):
        states.append(tracker.track(states[-1], ramp, k * DT, DT))
    p = np.array([s.position for s in states])
    v = np.array([s.velocity for s in states])
    a = np.array([s.acceleration for s in states])
    assert_within(limits, v, a)
    assert np.all(v[:, 0] >= -1e-9)
    times = np.arange(251) * DT
    error = np.abs(p[:, 0] - times)
    off = np.flatnonzero(error > 1e-9)
    rejoined = int(off[-1]) + 1  # on the reference from this tick on
    assert off[0] == 1 and rejoined < 100
    # The lag peaks when the command reaches 1 rad/s: v²/(2a) + v·a/(2j) = 0.051 rad.
    assert error.max() == pytest.approx(0.051, abs=1e-3)
    assert tracker.failures == 0


def test_unreachable_reference_velocity_is_clipped_not_an_error(limits):
    tracker = JerkLimitedTracker(limits)

    def too_fast(t):
        return np.full(8, 100.0 * t), np.full(8, 100.0), np.zeros(8)

    p, v, a = run(
        tracker,
        MotionState.at_rest(np.zeros(8)),
        100,
        lambda s: tracker.track(s, too_fast, 0.0, DT),
    )
    assert_within(limits, v, a)
    assert tracker.failures == 0


def test_brake_stops_one_joint_at_its_limits(limits):
    tracker = JerkLimitedTracker(limits)
    velocity = np.zeros(8)
    velocity[0] = 2.358
    p, v, a = run(tracker, MotionState(np.zeros(8), velocity, np.zeros(8)), 100,
                  lambda s: tracker.brake(s, DT))  # fmt: skip
    assert_within(limits, v, a)
    # 2.358 rad/s with 10 rad/s² and 5000 rad/s³: stops after v/a + a/j = 0.2378 s, having
    # covered v²/(2a) + v·a/(2j) = 0.2804 rad (no overshoot, no extrapolation).
    stopped = int(np.argmax(np.abs(v[:, 0]) < 1e-12))
    assert stopped == pytest.approx(0.2378 / DT, abs=1.0)
    assert p[-1][0] == pytest.approx(2.358**2 / 20 + 2.358 * 10 / 10000, abs=1e-4)
    assert np.all(np.diff(p[:, 0]) >= -1e-12)  # never reverses
    assert np.all(p[stopped:] == p[-1])


def test_brake_stops_all_joints_together_within_limits(limits):
    tracker = JerkLimitedTracker(limits)
    moving = MotionState(np.zeros(8), limits.velocity * 0.9, limits.acceleration * 0.5)
    p, v, a = run(tracker, moving, 150, lambda s: tracker.brake(s, DT))
    assert_within(limits, v, a)
    # Time-synchronised: every joint stops at the same tick, set by the slowest (joints 5 and
    # 7 at 4.734 rad/s, still accelerating at 5 rad/s²).
    stopped = [int(np.argmax(np.abs(v[:, j]) < 1e-12)) for j in range(8)]
    assert len(set(stopped)) == 1 and 120 <= stopped[0] <= 135
    np.testing.assert_allclose(v[-1], 0.0, atol=1e-12)
