"""Pure logic of the direct drivers: command conversion, error kinds, back-off."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.direct_driver import ArmCommand, Reconnector, classify_libfranka_error

JOINTS = ("j1", "j2")
LOWER, UPPER = (-1.0, -2.0), (1.0, 2.0)


def command(finger: bool = False) -> ArmCommand:
    return ArmCommand(
        JOINTS, LOWER, UPPER, start=(0.1, 0.2), finger_joint="f1" if finger else None,
        max_width=0.08,
    )  # fmt: skip


def test_holds_the_start_until_commanded():
    cmd = command()
    p, v = cmd.sample(5.0)
    np.testing.assert_array_equal(p, [0.1, 0.2])
    np.testing.assert_array_equal(v, [0.0, 0.0])
    assert not cmd.trajectory_active


def test_trajectory_with_stamp_zero_starts_now_from_the_current_setpoint():
    cmd = command()
    # Joint names in any order; positions only -> linear segments.
    assert cmd.set_trajectory(["j2", "j1"], [[0.4, 0.5]], [1.0], now=10.0) is None
    p, v = cmd.sample(10.5)
    np.testing.assert_allclose(p, [0.3, 0.3])  # halfway from (0.1, 0.2) to (0.5, 0.4)
    np.testing.assert_allclose(v, [0.4, 0.2])
    p, v = cmd.sample(11.5)  # after the end: holds the last point, trajectory done
    np.testing.assert_allclose(p, [0.5, 0.4])
    np.testing.assert_array_equal(v, [0.0, 0.0])
    assert not cmd.trajectory_active


def test_stamped_trajectory_holds_until_its_start():
    cmd = command()
    assert cmd.set_trajectory(["j1", "j2"], [[0.3, 0.2]], [1.0], start_time=12.0, now=10.0) is None
    np.testing.assert_allclose(cmd.sample(11.0)[0], [0.1, 0.2])
    np.testing.assert_allclose(cmd.sample(12.5)[0], [0.2, 0.2])


def test_rejected_commands_give_the_reason_and_freeze_where_the_setpoint_is():
    cmd = command()
    assert cmd.set_trajectory(["j1", "j2"], [[0.5, 0.2]], [1.0], now=0.0) is None
    reason = cmd.set_trajectory(["j1", "j2"], [[1.5, 0.2]], [1.0], now=0.5)
    assert reason and "j1" in reason
    assert not cmd.trajectory_active
    np.testing.assert_allclose(cmd.sample(3.0)[0], [0.3, 0.2])  # frozen at t = 0.5
    assert "past" in cmd.set_trajectory(["j1", "j2"], [[0.0, 0.0]], [1.0], start_time=1.0, now=5.0)
    assert cmd.set_positions([0.0]) == "1 positions for 2 arm joints"
    assert cmd.set_positions([0.0, float("nan")]).startswith("non-finite")
    assert cmd.set_positions([0.0, 2.5]) == "j2 = 2.5 outside [-2.0, 2.0]"
    assert cmd.set_positions([-0.5, 1.5]) is None
    np.testing.assert_allclose(cmd.sample(9.0)[0], [-0.5, 1.5])


def test_tracking_covers_trajectories_and_forward_streams_but_not_a_lone_step():
    cmd = command()
    assert not cmd.tracking(0.0)
    assert cmd.set_positions([0.3, 0.2], now=1.0) is None
    assert not cmd.tracking(1.001)  # one forward command: a step
    assert cmd.set_positions([0.31, 0.2], now=1.004) is None
    assert cmd.tracking(1.006)  # a 250 Hz stream
    assert not cmd.tracking(1.004 + 0.051)  # the stream stopped: holding, not tracking
    assert cmd.set_positions([0.5, 0.2], now=2.0) is None
    assert not cmd.tracking(2.001)  # a new step long after the last command
    assert cmd.set_positions([5.0, 0.2], now=2.004) is not None  # rejected: no stream either
    assert not cmd.tracking(2.005)
    assert cmd.set_trajectory(JOINTS, [[0.0, 0.0]], [1.0], now=3.0) is None
    assert cmd.tracking(3.5)


def test_finger_column_becomes_a_desired_width():
    cmd = command(finger=True)
    assert cmd.set_trajectory(["f1", "j1", "j2"], [[0.01, 0.1, 0.2]], [1.0], now=0.0) is None
    cmd.sample(2.0)
    assert cmd.desired_width == pytest.approx(0.02)  # one finger 0.01 m -> width 0.02 m
    assert "f1" in cmd.set_trajectory(["f1", "j1", "j2"], [[0.05, 0.1, 0.2]], [1.0], now=3.0)


def test_a_stream_sample_is_the_setpoint_now_and_the_target_ahead_handing_the_width_over_once():
    cmd = command(finger=True)
    assert cmd.set_trajectory(["j1", "j2", "f1"], [[0.5, 0.6, 0.01]], [1.0], now=0.0) is None
    sample = cmd.stream_sample(0.5, lookahead=0.1)
    assert sample.tracking
    np.testing.assert_allclose(sample.desired, [0.3, 0.4])  # halfway from (0.1, 0.2)
    np.testing.assert_allclose(sample.target, [0.34, 0.44])  # 0.6 s along
    np.testing.assert_allclose(sample.target_velocity, [0.4, 0.4])
    assert sample.desired_width == pytest.approx(2 * 0.022)  # 0.6 s along from 0.04 to 0.01 m
    assert cmd.desired_width is None  # handed over
    # Sampling ahead past the end finishes the trajectory; the setpoint now was taken first.
    sample = cmd.stream_sample(0.95, lookahead=0.1)
    assert sample.tracking
    np.testing.assert_allclose(sample.desired, [0.48, 0.58])
    np.testing.assert_allclose(sample.target, [0.5, 0.6])
    np.testing.assert_array_equal(sample.target_velocity, [0.0, 0.0])
    assert not cmd.trajectory_active
    assert cmd.stream_sample(2.0, lookahead=0.1).desired_width is None  # holding: no new width


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("libfranka: Move command aborted: motion aborted by reflex! "
         "[\"joint_motion_generator_position_discontinuity\"]", "discontinuity"),
        ("control_command_success_rate: communication_constraints_violation",
         "communication_constraints_violation"),
        ("motion aborted by reflex! [\"cartesian_reflex\"]", "reflex"),
        ("[\"joint_position_limits_violation\"]", "limit_violation"),
        ("Connection refused", "other"),
    ],
)  # fmt: skip
def test_libfranka_errors_are_classified(message, kind):
    assert classify_libfranka_error(message) == kind


def test_reconnector_backs_off_exponentially_then_gives_up():
    r = Reconnector(initial_delay=0.5, max_delay=2.0, max_attempts=4)
    r.lost(10.0)
    assert (r.state, r.retry_at) == ("waiting", 10.5)
    assert not r.should_try(10.4) and r.should_try(10.5)
    r.lost(10.5)
    assert r.retry_at == 11.5  # 1 s
    r.lost(11.5)
    assert r.retry_at == 13.5  # 2 s (capped)
    r.lost(13.5)
    assert r.state == "failed" and not r.should_try(100.0)
    r.reset(100.0)
    assert r.should_try(100.0)
    r.connected()
    assert (r.state, r.attempts) == ("connected", 0)
