"""Pacing the simulation: streams on the physics-step grid, steps due against wall time x the
real-time factor (rebasing when too far behind), and the achieved factor with its warning."""

import math

import pytest

from vla_runtime.core.pacing import FAST_BATCH_STEPS, RtfMeter, StepGrid, WallPacer


def test_streams_publish_on_the_step_grid():
    grid = StepGrid({"clock_rate_hz": 500.0, "state_rate_hz": 300.0, "scene": 100.0}, 1000)
    assert grid.periods == (2, 3, 10)  # 1000 / 300 rounds to every 3rd step
    assert grid.due(30) == (True, True, True)
    assert grid.due(6) == (True, True, False)
    assert grid.due(7) == (False, False, False)
    assert grid.steps_to_next(7) == 1  # the clock at 8
    assert grid.steps_to_next(30) == 2


@pytest.mark.parametrize("rate", [0.0, -1.0, 1000.5])
def test_a_rate_off_the_grid_is_refused_by_name(rate):
    with pytest.raises(ValueError, match=rf"state_rate_hz must be in \(0, 1000\], got {rate}"):
        StepGrid({"clock_rate_hz": 500.0, "state_rate_hz": rate}, 1000)


def test_steps_due_keep_sim_time_at_wall_time_times_the_factor():
    pacer = WallPacer(dt=0.001, rtf=2.0, wall0=10.0, sim0=5.0)
    assert pacer.due(10.0, 5.0) == 0
    assert pacer.due(10.01, 5.0) == 20  # 10 ms of wall time at 2x
    assert pacer.due(10.01, 5.015) == 5
    assert pacer.due(10.01, 5.03) == 0  # ahead: nothing due
    assert pacer.idle_s == 0.0005


def test_far_behind_it_takes_one_capped_batch_and_rebases():
    pacer = WallPacer(dt=0.001, rtf=1.0, wall0=0.0, sim0=0.0, max_lag_s=0.25)
    assert pacer.due(1.0, 0.0) == 250  # a second behind: no burst of 1000 steps
    assert pacer.due(1.0, 0.25) == 0  # paced from the rebase on
    assert pacer.due(1.3, 0.25) == 50


def test_factor_zero_runs_as_fast_as_possible():
    pacer = WallPacer(dt=0.001, rtf=0.0, wall0=0.0, sim0=0.0)
    assert pacer.due(0.0, 100.0) == FAST_BATCH_STEPS


def test_achieved_factor_per_window_and_a_lag_warning_every_30_s():
    meter = RtfMeter(rtf=1.0, wall0=100.0, sim0=0.0, window_s=2.0)
    assert not meter.update(101.0, 1.0) and math.isnan(meter.achieved)  # window not over
    assert meter.update(102.0, 1.0) and meter.achieved == 0.5  # half speed: warn
    assert not meter.update(104.0, 2.0) and meter.achieved == 0.5  # warned 2 s ago
    assert not meter.update(106.0, 4.0) and meter.achieved == 1.0
    assert meter.update(140.0, 5.0)  # lagging again, 38 s after the warning
    assert not RtfMeter(rtf=0.0, wall0=0.0, sim0=0.0).update(50.0, 1.0)  # nothing asked
