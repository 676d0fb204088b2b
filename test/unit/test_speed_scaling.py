"""Speed scaling (UR speed slider): reading conversion, the plan clock, and the streamer running
its plan at s x real time with stale dropping, pause and requests on plan time.

Times are multiples of 1/64 s (ticks) and 1/8 s (actions) so every number is exact."""

import math

import numpy as np
import pytest

from vla_runtime.core.interpolation import Limits
from vla_runtime.core.speed_scaling import (
    UR_SPEED_SCALING_TOPIC,
    PlanClock,
    SpeedScalingInput,
    SpeedSlider,
    broadcast_topic,
    speed_fraction,
)
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.metrics import streamer_metrics
from vla_runtime.core.streaming.streamer import ActionStreamer

TICK = 1 / 64
ACTION_DT = 0.125
# One joint with limits wide enough that the command tracks the plan exactly.
LIMITS = Limits(np.array([10.0]), np.array([100.0]), np.array([1e4]))


def make_streamer(scale=1.0, **config) -> ActionStreamer:
    config.setdefault("control_period_s", TICK)
    config.setdefault("blend_window_s", 0.0)
    config.setdefault("warmup_requests", 0)
    streamer = ActionStreamer(StreamerConfig(**config), LIMITS, [0.0])
    streamer.set_speed_scaling(scale)
    return streamer


def wave(tau):
    """The chunk's motion over plan time: 0.2 sin(pi tau)."""
    return 0.2 * np.sin(np.pi * np.asarray(tau))


def merge_wave(streamer, now=0.0, t_obs=0.0, n=17):
    tfs = ACTION_DT * np.arange(n)  # 0 .. 2 s
    return streamer.merge_chunk(now, t_obs, tfs, wave(tfs)[:, None])


def ticks(streamer, first, last):
    """Ticks at now = k / 64 for first <= k <= last."""
    return [streamer.tick(k * TICK) for k in range(first, last + 1)]


# ---------------------------------------------------------------------------- readings


@pytest.mark.parametrize(
    ("reading", "unit", "fraction", "warning"),
    [
        (100.0, "percent", 1.0, None),  # UR driver, slider at 100 %
        (50.0, "percent", 0.5, None),
        (0.0, "percent", 0.0, None),  # program paused
        (100.00000001, "percent", 1.0, None),  # rounding: clamped silently
        (0.25, "fraction", 0.25, None),
        (-3.0, "percent", 0.0, "negative"),
        (150.0, "percent", 1.0, "above 100 %"),
        (100.0, "fraction", 1.0, "publishes percent"),
        (math.nan, "percent", None, "not finite"),
        (math.inf, "fraction", None, "not finite"),
    ],
)
def test_speed_fraction_converts_clamps_and_rejects(reading, unit, fraction, warning):
    value, message = speed_fraction(reading, unit)
    assert value == fraction
    if warning is None:
        assert message is None
    else:
        assert warning in message


def test_speed_fraction_refuses_an_unknown_unit():
    with pytest.raises(ValueError, match="unit"):
        speed_fraction(50.0, "permille")


# ---------------------------------------------------------------------------- plan clock


def test_plan_clock_is_the_identity_until_the_speed_changes():
    clock = PlanClock()
    assert clock.scale == 1.0 and clock.at(123.456) == 123.456
    clock.set_scale(1.0, 5.0)  # no change, no breakpoint
    assert clock.at(7.1) == 7.1


def test_plan_clock_integrates_the_speed_and_maps_past_times():
    clock = PlanClock()
    clock.set_scale(0.5, 10.0)
    clock.set_scale(0.0, 12.0)
    clock.set_scale(1.0, 15.0)
    assert [clock.at(t) for t in (5.0, 10.0, 11.0, 12.0, 14.0, 15.0, 16.0)] == [
        5.0, 10.0, 10.5, 11.0, 11.0, 11.0, 12.0,
    ]  # fmt: skip
    clock.set_scale(0.25, 14.0)  # dated before the newest breakpoint: takes effect there
    assert clock.at(19.0) == 12.0
    clock.set_scale(0.5, 15.0)  # two changes at one instant: the later one wins
    assert clock.at(19.0) == 13.0 and clock.scale == 0.5
    with pytest.raises(ValueError):
        clock.set_scale(1.5, 20.0)


def test_plan_clock_forgets_old_breakpoints_but_keeps_the_segment_in_force():
    clock = PlanClock(history_s=10.0)
    clock.set_scale(0.5, 0.0)
    clock.set_scale(0.25, 4.0)  # tau(4) = 2
    clock.set_scale(1.0, 20.0)  # tau(20) = 6; forgets the breakpoint at 0, keeps 4
    assert clock.at(12.0) == 4.0
    assert clock.at(2.0) == 1.0  # before the history kept: the forgotten slope extended


# ---------------------------------------------------------------------------- streamer


def test_half_speed_runs_the_same_plan_at_half_the_rate():
    full, half = make_streamer(1.0), make_streamer(0.5)
    merge_wave(full)
    merge_wave(half)
    at_full, at_half = ticks(full, 0, 128), ticks(half, 0, 256)
    for k in (8, 16, 40, 64, 100, 128):
        a, b = at_full[k], at_half[2 * k]
        assert b.time == 2 * a.time
        assert b.position[0] == pytest.approx(a.position[0], abs=1e-12)
        assert b.velocity[0] == pytest.approx(0.5 * a.velocity[0], abs=1e-12)
    tau = 100 * TICK / 2
    assert at_half[100].position[0] == pytest.approx(half.plan.sample(tau)[0][0], abs=1e-12)
    m_full, m_half = streamer_metrics(full), streamer_metrics(half)
    assert m_full["executed_actions"] == m_half["executed_actions"] == 17
    assert m_half["stale_executed"] == m_half["empty_plan_ticks"] == 0
    assert (m_half["speed_scaling"], m_half["plan_lag_s"]) == (0.5, 2.0)


@pytest.mark.parametrize(
    ("scale", "driver_delay", "t_obs", "dropped"),
    [
        # Arrival at now = 1 s, actions every 1/8 s from t_obs.
        (1.0, 0.0, 0.0, 8),  # 1 s of plan passed: actions 0 .. 7 are stale
        (0.5, 0.0, 0.0, 4),  # only 0.5 s of plan passed
        (0.25, 0.0, 0.0, 2),
        (0.0, 0.0, 0.0, 0),  # paused since the observation: nothing is late
        (1.0, 0.125, 0.5, 5),  # command time 1.125: 0.625 s of plan since t_obs
        (0.5, 0.125, 0.5, 3),  # tau(t_obs) = 0.3125, tau(t_c) = 0.625
    ],
)
def test_stale_prefix_is_measured_in_plan_time(scale, driver_delay, t_obs, dropped):
    streamer = make_streamer(scale, driver_delay_s=driver_delay)
    ticks(streamer, 0, 64)  # now = 0 .. 1 s, no plan yet
    result = merge_wave(streamer, now=1.0, t_obs=t_obs)
    assert result.accepted and result.stale_dropped == dropped
    assert streamer_metrics(streamer)["stale_dropped"] == dropped


def test_pause_holds_the_plan_point_and_resume_continues_the_plan():
    streamer = make_streamer(1.0)
    merge_wave(streamer)
    ticks(streamer, 0, 16)  # tau = 0.25, moving at 0.2 pi cos(pi / 4) rad/s
    streamer.set_speed_scaling(0.0)
    paused = ticks(streamer, 17, 144)  # 2 s paused
    m = streamer_metrics(streamer)
    assert m["paused_ticks"] == 128 and m["executed_actions"] == 3  # tau 0, 0.125, 0.25
    assert m["empty_plan_ticks"] == m["stale_dropped"] == m["stale_executed"] == 0
    assert not any(s.holding for s in paused)  # paused on a plan, not out of plan
    assert paused[-1].position[0] == pytest.approx(wave(0.25), abs=1e-9)
    assert paused[-1].velocity[0] == pytest.approx(0.0, abs=1e-9)
    assert not streamer.want_request(144 * TICK)  # a standing plan needs no new chunk

    streamer.set_speed_scaling(1.0)  # tau(t) = t - 2 from now on
    request = streamer.make_request(144 * TICK)
    np.testing.assert_array_equal(request.times_from_start, ACTION_DT * np.arange(1, 15))
    ticks(streamer, 145, 287)  # the plan ends at tau = 2, t = 4; ticks until t < 4.5
    m = streamer_metrics(streamer)
    assert m["executed_actions"] == 17 and m["stale_executed"] == 0
    assert m["empty_plan_ticks"] == 31 and m["paused_ticks"] == 128
    assert m["plan_lag_s"] == 2.0


def test_a_pause_after_the_plan_ran_out_is_not_an_empty_plan():
    streamer = make_streamer(1.0)
    merge_wave(streamer, n=3)  # plan ends at tau = 0.25
    ticks(streamer, 0, 20)  # 4 ticks past the end
    streamer.set_speed_scaling(0.0)
    ticks(streamer, 21, 30)
    m = streamer_metrics(streamer)
    assert (m["empty_plan_ticks"], m["paused_ticks"], m["holding"]) == (4, 10, True)


@pytest.mark.parametrize(
    ("scale", "policy", "wanted"),
    [
        (1.0, "threshold", True),  # 8 steps left < 16 margin
        (0.75, "threshold", True),  # the 8 steps last 10.7 ticks < 16
        (0.5, "threshold", False),  # they last 16 ticks: not yet
        (0.0, "threshold", False),
        (1.0, "continuous", True),
        (0.0, "continuous", False),
    ],
)
def test_request_threshold_counts_the_remaining_plan_at_the_current_speed(scale, policy, wanted):
    streamer = make_streamer(1.0, margin_steps=16, request_policy=policy)
    merge_wave(streamer)
    ticks(streamer, 0, 120)  # tau = 1.875: 8 steps of plan left
    assert streamer.remaining_steps() == 8
    streamer.set_speed_scaling(scale)
    assert streamer.want_request(120 * TICK) is wanted


@pytest.mark.parametrize("bad", [math.nan, -0.1, 1.5])
def test_streamer_refuses_a_speed_outside_0_1(bad):
    with pytest.raises(ValueError, match="speed scaling"):
        make_streamer().set_speed_scaling(bad)


def test_speed_scaling_input_keeps_the_last_valid_reading_and_notes_pauses():
    from_topic = SpeedScalingInput("percent")
    assert from_topic.fraction is None and from_topic.age(5.0) is None
    assert from_topic.read(50.0, now=1.0) == (0.5, None, "speed scaling 50%")
    assert from_topic.read(40.0, now=2.0) == (0.4, None, None)
    assert from_topic.read(0.0, now=3.0) == (0.0, None, "speed scaling 0: plan paused")
    fraction, warning, note = from_topic.read(math.nan, now=4.0)
    assert (fraction, note) == (None, None) and "not finite" in warning
    assert (from_topic.fraction, from_topic.rejected, from_topic.age(4.5)) == (0.0, 1, 1.5)
    assert from_topic.read(120.0, now=5.0)[::2] == (1.0, "speed scaling 100%: plan resumed")
    with pytest.raises(ValueError, match="speed_scaling_unit"):
        SpeedScalingInput("permille")


def test_a_simulated_arm_broadcasts_speed_scaling_where_the_ur_driver_would():
    ur = "scaled_joint_trajectory_controller"
    assert broadcast_topic("auto", ur) == UR_SPEED_SCALING_TOPIC
    assert broadcast_topic("auto", "fr3_arm_controller") == ""
    assert broadcast_topic("", ur) == ""  # turned off
    assert broadcast_topic("/slider", "fr3_arm_controller") == "/slider"


def test_a_simulated_pendant_slider_takes_fractions_and_publishes_percent():
    slider = SpeedSlider(0.25)
    assert slider.percent == 25.0
    assert slider.set(0.5) is None and slider.percent == 50.0
    for refused in (1.5, -0.1, math.nan, 1, True, "0.5"):  # an integer is not a float either
        assert slider.set(refused) == "speed_scaling must be a float in [0, 1]"
    assert slider.fraction == 0.5
    with pytest.raises(ValueError, match=r"speed_scaling must be in \[0, 1\], got 1.2"):
        SpeedSlider(1.2)
