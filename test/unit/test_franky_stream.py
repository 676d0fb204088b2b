"""The direct Franka driver's streaming: its settings, which ticks send a target (on the robot's
clock), the wall-time schedule of state reads, and the figures it reports."""

import re

import numpy as np
import pytest

from vla_runtime.core.franky_stream import StreamConfig, StreamStats, TargetStream
from vla_runtime.core.stats import Reservoir


def test_default_settings_stream_50_targets_a_second_among_250_state_reads():
    config = StreamConfig().validated()
    assert (config.stream_rate_hz, config.state_rate_hz) == (50.0, 250.0)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (StreamConfig(realtime_config="soft"),
         "realtime_config must be enforce or ignore, got 'soft'"),
        (StreamConfig(relative_dynamics_factor=0.0),
         "relative_dynamics_factor must be in (0, 1], got 0.0"),
        (StreamConfig(relative_dynamics_factor=1.5),
         "relative_dynamics_factor must be in (0, 1], got 1.5"),
        (StreamConfig(stream_rate_hz=300.0),
         "need 1 <= stream_rate_hz (300.0) <= state_rate_hz (250.0) <= 1000"),
        (StreamConfig(stream_rate_hz=0.5), "need 1 <= stream_rate_hz (0.5)"),
        (StreamConfig(state_rate_hz=2000.0), "state_rate_hz (2000.0) <= 1000"),
    ],
)  # fmt: skip
def test_settings_out_of_range_are_refused_with_the_reason(config, problem):
    assert problem in config.problem()
    with pytest.raises(ValueError, match=re.escape(problem)):
        config.validated()


def test_targets_go_out_once_per_period_and_the_period_between_them_is_measured():
    periods = Reservoir()
    ticks = TargetStream(StreamConfig(stream_rate_hz=100.0, state_rate_hz=400.0), periods)
    sends = [ticks.tick(t) for t in (0.0, 0.0025, 0.005, 0.0075, 0.0104, 0.0125, 0.015, 0.0175,
                                     0.0199)]  # fmt: skip
    assert sends == [True, False, False, False, True, False, False, False, True]
    assert periods.samples == pytest.approx([0.0104, 0.0095])


def test_targets_are_paced_by_the_robots_clock_when_it_runs_slower_than_wall_time():
    """franky-sim at a third of real time: three seconds of wall time, 750 state reads, see one
    second of the robot's clock pass (on /clock's 10 ms grid): 50 targets at 50 Hz, not 150."""
    periods = Reservoir()
    ticks = TargetStream(StreamConfig(stream_rate_hz=50.0, state_rate_hz=250.0), periods)
    walls = np.arange(750) / 250.0
    sends = [ticks.tick(w, np.floor(w / 3.0 * 100.0) / 100.0) for w in walls]
    assert sum(sends) == 50
    assert np.allclose(periods.samples, 0.02)


def test_a_clock_that_steps_back_restarts_the_schedule_at_once():
    ticks = TargetStream(StreamConfig(stream_rate_hz=50.0, state_rate_hz=250.0), Reservoir())
    assert ticks.tick(0.0, 5.0) and not ticks.tick(0.004, 5.004)
    assert ticks.tick(0.008, 0.0)  # the simulator restarted: no wait for 5.02 s to come again
    assert not ticks.tick(0.012, 0.004) and ticks.tick(0.028, 0.02)
    assert ticks.tick(0.1, 0.1)  # overran by three periods: one target now, a fresh grid
    assert not ticks.tick(0.104, 0.104) and ticks.tick(0.12, 0.12)


def test_the_schedule_waits_out_the_period_and_starts_afresh_after_an_overrun():
    ticks = TargetStream(StreamConfig(stream_rate_hz=50.0, state_rate_hz=250.0), Reservoir())
    ticks.tick(10.0)
    assert ticks.wait_s(10.001) == pytest.approx(0.003)  # next tick at 10.004
    ticks.tick(10.004)
    assert ticks.wait_s(10.0065) == pytest.approx(0.0015)  # at 10.008, on the original grid
    ticks.tick(10.008)
    assert ticks.wait_s(10.020) == 0.0  # overran by 8 ms: no burst of catch-up ticks
    ticks.tick(10.020)
    assert ticks.wait_s(10.021) == pytest.approx(0.003)  # the grid restarted at 10.020


def test_only_a_target_that_differs_from_the_last_one_sent_is_new():
    ticks = TargetStream(StreamConfig(), Reservoir())
    target = np.array([0.1, 0.2, 0.0, 0.0])
    assert ticks.is_new(target)
    ticks.sent(target)
    assert not ticks.is_new(target.copy())
    assert ticks.is_new(target + [0.0, 1e-9, 0.0, 0.0])
    ticks.forget()  # after an error the same target goes out again
    assert ticks.is_new(target)


def test_the_report_has_the_errors_by_kind_times_in_ms_and_the_tracking_error():
    stats = StreamStats(stream_rate_hz=50.0)
    assert stats.libfranka_error("control_command_success_rate: too low") == (
        "communication_constraints_violation"
    )
    assert stats.libfranka_error("Connection refused") == "other"
    for period in (0.019, 0.021):
        stats.periods.add(period)
    stats.move_calls.add(0.0005)
    stats.tracked(np.array([0.1, 0.5]), np.array([0.15, 0.48]))
    report = stats.report({"move": 1, "grasp": 2, "failed": 0}, 0.04, "connected")
    assert report["libfranka_errors"] == 2
    assert report["libfranka_errors_by_kind"]["communication_constraints_violation"] == 1
    assert report["libfranka_errors_by_kind"]["other"] == 1
    assert report["stream_period_ms"]["mean"] == pytest.approx(20.0)
    assert report["stream_period_ms"]["max"] == pytest.approx(21.0)
    assert "n" not in report["stream_period_ms"]
    assert report["stream_period_target_ms"] == 20.0
    assert report["move_call_ms"]["max"] == pytest.approx(0.5)
    assert report["tracking_error_rad"]["max"] == pytest.approx(0.05)
    assert report["gripper_calls"] == {"move": 1, "grasp": 2, "failed": 0}
    assert (report["gripper_width_m"], report["connection"]) == (0.04, "connected")
    empty = StreamStats(stream_rate_hz=50.0).report({}, 0.08, "waiting")
    assert empty["stream_period_ms"] == {"p50": None, "p99": None, "max": None, "mean": None}
