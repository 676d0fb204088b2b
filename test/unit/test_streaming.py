"""Streaming core: stale-prefix dropping, blending, hold, request policy, metrics."""

import numpy as np
import pytest

from vla_runtime.core.interpolation import limits_for
from vla_runtime.core.robot import load_robot
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.handover import smoothstep
from vla_runtime.core.streaming.metrics import streamer_metrics
from vla_runtime.core.streaming.plan import Plan, finite_difference_velocities
from vla_runtime.core.streaming.streamer import MAX_TICK_PERIODS, ActionStreamer

PERIOD = 0.004
ROBOT = load_robot("fr3")
LIMITS = limits_for(ROBOT)
HOME = np.array([*ROBOT.home, 0.04])
E0 = np.eye(8)[0]


def make_streamer(**config) -> ActionStreamer:
    config.setdefault("control_period_s", PERIOD)
    config.setdefault("warmup_requests", 0)
    return ActionStreamer(StreamerConfig(**config), LIMITS, HOME, arm_dof=7)


def chunk_times(n=10, dt=0.02):
    return dt * (np.arange(n) + 1)


def line(times, speed=0.2, offset=0.0, origin=1.0):
    """Joint 1 moves at `speed` rad/s through HOME + offset at `origin`; the rest is HOME."""
    return HOME + np.outer(speed * (np.asarray(times) - origin) + offset, E0)


def tick_until(streamer, start, stop):
    """Ticks at now = i * PERIOD for start <= now < stop."""
    first, last = round(start / PERIOD), round(stop / PERIOD)
    return [streamer.tick(i * PERIOD) for i in range(first, last)]


def test_smoothstep_values():
    w, dw = smoothstep(np.array([0.0, 0.5, 1.0, 2.0]))
    assert w.tolist() == [0.0, 0.5, 1.0, 1.0]
    assert dw.tolist() == [0.0, 1.875, 0.0, 0.0]


def test_finite_difference_velocities_exact_for_quadratics_on_uneven_grid():
    times = np.array([0.0, 1.0, 3.0, 3.5])
    positions = (times**2)[:, None]
    velocities = finite_difference_velocities(times, positions)[:, 0]
    assert velocities[1:3].tolist() == [2.0, 6.0]  # 2t inside
    assert velocities[0] == 1.0 and velocities[3] == 6.5  # one-sided slopes at the ends


def test_plan_interpolates_a_line_exactly():
    times = np.array([1.0, 1.02, 1.05, 1.1])
    positions = line(times)
    plan = Plan(times, positions, finite_difference_velocities(times, positions), [True] * 4)
    p, v, a = plan.sample(1.037)
    np.testing.assert_allclose(p, line([1.037])[0], atol=1e-15)
    assert v[0] == pytest.approx(0.2) and np.all(v[1:] == 0) and np.allclose(a, 0)
    with pytest.raises(ValueError):
        Plan([1.0, 1.0], positions[:2], positions[:2], [True, True])


@pytest.mark.parametrize(
    ("driver_delay", "dropped"),
    [(0.0, 7), (0.015, 8), (0.035, 9)],
)
def test_stale_prefix_dropped_at_the_right_index(driver_delay, dropped):
    streamer = make_streamer(driver_delay_s=driver_delay)
    streamer.tick(1.0)
    # Observation at 0.9 s, actions for 0.92, 0.94, ... 1.10 s, arriving at 1.05 s: actions
    # before 1.05 s + driver delay can no longer be applied on time.
    times = chunk_times()
    result = streamer.merge_chunk(1.05, 0.9, times, line(0.9 + times))
    assert result.accepted and result.stale_dropped == dropped
    plan = streamer.plan
    assert plan.times[0] == pytest.approx(1.05 + driver_delay)  # anchor at the hand-over
    np.testing.assert_allclose(plan.times[1:], 0.9 + times[dropped:])
    assert plan.is_action.tolist() == [False] + [True] * (10 - dropped)
    tick_until(streamer, 1.05, 1.3)
    metrics = streamer_metrics(streamer)
    assert metrics["stale_dropped"] == dropped
    assert metrics["executed_actions"] == 10 - dropped
    assert metrics["stale_executed"] == 0


def test_the_gripper_follows_the_plan_later_by_the_delay_only_the_arm_has():
    # Commands lead by 86 ms: 26 ms to either, and 60 ms more to the arm (a trajectory
    # controller's lookahead). Both must be on the plan at the same moment.
    streamer = make_streamer(driver_delay_s=0.086, arm_only_delay_s=0.06)
    streamer.tick(1.0)
    times = 0.9 + chunk_times(n=40)
    positions = line(times)
    positions[:, 7] = 0.04 - 0.02 * (times - 0.9)  # the fingers close at 2 cm/s
    assert streamer.merge_chunk(1.0, 0.9, times - 0.9, positions).accepted
    setpoint = tick_until(streamer, 1.0, 1.5)[-1]  # past the start-up blend
    now = 1.5 - PERIOD
    assert setpoint.position[0] == pytest.approx(line([now + 0.086])[0][0], abs=1e-6)
    assert setpoint.position[7] == pytest.approx(0.04 - 0.02 * (now + 0.026 - 0.9), abs=1e-6)


def test_chunk_entirely_stale_is_rejected_and_counted():
    streamer = make_streamer(driver_delay_s=0.01)
    streamer.tick(1.0)
    result = streamer.merge_chunk(1.0, 0.5, chunk_times(), line(0.5 + chunk_times()))
    assert not result.accepted and result.stale_dropped == 10 and "stale" in result.reason
    assert streamer.plan is None
    metrics = streamer_metrics(streamer)
    assert (metrics["stale_dropped"], metrics["chunks_rejected"]) == (10, 1)


@pytest.mark.parametrize(
    ("t_obs", "times", "positions", "reason"),
    [
        (1.0, [], np.empty((0, 8)), "empty"),
        (1.0, chunk_times(3), np.full((3, 8), np.nan), "non-finite"),
        (1.0, chunk_times(3), np.zeros((3, 7)), "expected (3, 8)"),
        (1.0, [0.02, 0.02, 0.04], line([1, 1, 1]), "increase by at least"),
        (1.0, [0.02, 0.02 + 1e-9, 0.04], line([1, 1, 1]), "increase by at least"),
        (2.0, chunk_times(3), line(2.0 + chunk_times(3)), "future"),
        (float("nan"), chunk_times(3), line(chunk_times(3)), "non-finite"),
    ],
)
def test_bad_chunks_are_rejected_and_the_arm_holds(t_obs, times, positions, reason):
    streamer = make_streamer()
    streamer.tick(1.0)
    result = streamer.merge_chunk(1.0, t_obs, times, positions)
    assert not result.accepted and reason in result.reason
    setpoints = tick_until(streamer, 1.004, 1.1)
    assert all(s.holding for s in setpoints)
    np.testing.assert_array_equal(setpoints[-1].position, HOME)
    assert streamer_metrics(streamer)["last_rejection"] == result.reason


def test_points_a_nanosecond_apart_at_epoch_stamps_are_rejected_not_fatal():
    now = 1.8e9  # float64 resolves 0.24 us here: 1 ns steps fall on the same time
    streamer = make_streamer()
    streamer.tick(now)
    times = 0.02 + 1e-9 * np.arange(16)
    result = streamer.merge_chunk(now, now, times, line(times))
    assert not result.accepted and "increase by at least" in result.reason
    assert all(s.holding for s in tick_until(streamer, now + 0.004, now + 0.05))


def test_blend_keeps_position_and_velocity_continuous():
    streamer = make_streamer(blend_window_s=0.09)
    streamer.tick(1.0)
    old_times = chunk_times(50)
    assert streamer.merge_chunk(1.0, 1.0, old_times, line(1.0 + old_times)).accepted
    tick_until(streamer, 1.004, 1.3)
    old_plan = streamer.plan
    before = [x.copy() for x in old_plan.sample(1.3)[:2]]
    # The new chunk agrees on the velocity but sits 0.02 rad further along joint 1.
    new_times = 1.285 + chunk_times(50)
    result = streamer.merge_chunk(1.3 - PERIOD, 1.285, chunk_times(50),
                                  line(new_times, offset=0.02))  # fmt: skip
    assert result.accepted and result.stale_dropped == 0
    assert result.blend_window_s == pytest.approx(0.09)
    plan = streamer.plan
    # Exactly continuous at the hand-over (the anchor is the old reference at that time).
    after = plan.sample(1.3 - PERIOD)[:2]
    expected = old_plan.sample(1.3 - PERIOD)[:2]
    np.testing.assert_array_equal(after[0], expected[0])
    np.testing.assert_array_equal(after[1], expected[1])
    np.testing.assert_allclose(plan.sample(1.3)[0], before[0], atol=1e-12)
    # First new action (blend weight 0): the old plan's state there.
    k0 = int(np.flatnonzero(np.isclose(plan.times, 1.305))[0])
    np.testing.assert_allclose(plan.positions[k0], line([1.305])[0], atol=1e-12)
    np.testing.assert_allclose(plan.velocities[k0], 0.2 * E0, atol=1e-12)
    # Inside the window the velocity adds w'(s) * gap / window: s = 4/9 at 1.345 s.
    s = 0.04 / 0.09
    k = k0 + 2
    assert plan.velocities[k][0] == pytest.approx(0.2 + 30 * s**2 * (1 - s) ** 2 * 0.02 / 0.09)
    # From the end of the window on, the new chunk unchanged.
    after_window = plan.times >= 1.395
    np.testing.assert_allclose(plan.positions[after_window], line(plan.times[after_window],
                               offset=0.02), atol=1e-12)  # fmt: skip
    # The spline is C1 everywhere: no position or velocity step at any knot.
    for t in plan.times[1:-1]:
        left, right = plan.sample(t - 1e-9), plan.sample(t + 1e-9)
        assert np.abs(left[0] - right[0]).max() < 1e-8
        assert np.abs(left[1] - right[1]).max() < 1e-5
    # The executed commands follow with bounded velocity changes and reach the new chunk.
    setpoints = tick_until(streamer, 1.3, 1.6)
    velocities = np.array([s.velocity for s in setpoints])
    assert np.abs(np.diff(velocities, axis=0)).max() <= 10.0 * PERIOD * (1 + 1e-6)
    np.testing.assert_allclose(setpoints[-1].position, line([setpoints[-1].time],
                               offset=0.02)[0], atol=1e-9)  # fmt: skip
    metrics = streamer_metrics(streamer)
    assert metrics["handovers"] == 1 and metrics["stale_executed"] == 0
    # Velocity jumps 0 in a constant-velocity line, so only the blend's bump is visible.
    assert metrics["handover_jump_p99"] > 0


def test_blend_limited_to_the_overlap_with_the_old_plan():
    streamer = make_streamer(blend_window_s=0.2)
    streamer.tick(1.0)
    assert streamer.merge_chunk(1.0, 1.0, chunk_times(10), line(1.0 + chunk_times(10))).accepted
    # Old plan ends at 1.2 s; the new chunk's first action is at 1.13 s: 0.07 s of overlap.
    result = streamer.merge_chunk(1.1, 1.1, chunk_times(10), line(1.1 + chunk_times(10)))
    assert result.blend_window_s == pytest.approx(0.08)


def following_a_line(actions: int) -> ActionStreamer:
    """A streamer that took, at t = 1 s, a chunk of `actions` moving joint 1 at 1 rad/s."""
    streamer = make_streamer()
    streamer.tick(1.0)
    times = chunk_times(actions)
    assert streamer.merge_chunk(1.0, 1.0, times, line(1.0 + times, speed=1.0, origin=1.0)).accepted
    return streamer


def test_hold_when_plan_runs_dry_decelerates_within_limits_and_stops():
    streamer = following_a_line(25)
    setpoints = tick_until(streamer, 1.004, 2.0)
    end = 1.5  # last action
    moving = [s for s in setpoints if s.time <= end]
    held = [s for s in setpoints if s.time > end]
    assert not moving[-1].holding and all(s.holding for s in held)
    assert moving[-1].velocity[0] == pytest.approx(1.0, abs=1e-6)
    v = np.array([s.velocity for s in held])
    a = np.array([s.acceleration for s in held])
    assert np.all(np.abs(a) <= LIMITS.acceleration * (1 + 1e-9))
    assert np.all(np.abs(np.diff(a, axis=0)) <= LIMITS.jerk * PERIOD * (1 + 1e-9))
    assert np.all(np.diff(v[:, 0]) <= 1e-12)  # decelerates only
    assert np.all(v[-50:] == 0.0)  # stopped, and stays stopped
    # Stopping from 1 rad/s takes v²/(2a) + v·a/(2j) = 0.051 rad past the last action: a
    # smooth stop, not an extrapolation of the chunk.
    last_action = line([end], speed=1.0)[0][0]
    assert held[-1].position[0] - last_action == pytest.approx(0.051, abs=2e-3)
    metrics = streamer_metrics(streamer)
    assert metrics["empty_plan_ticks"] == len(held)
    assert metrics["executed_actions"] == 25 and metrics["stale_executed"] == 0


def test_after_a_stall_the_command_goes_on_from_where_it_stopped_and_rejoins_the_plan():
    streamer = following_a_line(100)
    before = tick_until(streamer, 1.004, 1.5)
    assert before[-1].position[0] - HOME[0] == pytest.approx(before[-1].time - 1.0, abs=1e-6)
    after = tick_until(streamer, 1.7, 2.5)  # the process did not tick for 0.2 s (50 periods)
    # One tick moves the command as far as MAX_TICK_PERIODS periods within the limits allow
    # (0.048 rad), not by the whole stall (0.2 rad)...
    dt = MAX_TICK_PERIODS * PERIOD
    step = after[0].position[0] - before[-1].position[0]
    assert 0.0 < step <= 1.0 * dt + 0.5 * LIMITS.acceleration[0] * dt**2 + 1e-9
    # ... and it catches up within the limits, then runs on the plan again.
    v = np.array([s.velocity for s in after])
    a = np.array([s.acceleration for s in after])
    assert np.all(np.abs(v) <= LIMITS.velocity * (1 + 1e-9))
    assert np.all(np.abs(a) <= LIMITS.acceleration * (1 + 1e-9))
    lag = np.array([HOME[0] + s.time - 1.0 - s.position[0] for s in after])
    assert lag[0] > 0.1
    rejoined = np.flatnonzero(np.abs(lag) > 1e-6)[-1] + 1
    assert rejoined * PERIOD < 0.25, rejoined
    assert streamer_metrics(streamer)["stale_executed"] == 0


def run_request_scenario(streamer, answer_after_steps=0, last_tick=60):
    """Request at the first tick, answer after `answer_after_steps` ticks with a 10-action chunk
    (0.2 s) observed at the answer time; returns the index i (now = 0.004 i) of each tick after
    which the streamer wants a request, up to i = `last_tick`."""
    streamer.tick(0.0)
    assert streamer.want_request(0.0)
    request = streamer.make_request(0.0)
    assert request.request_id == 1 and request.times_from_start.size == 0
    for i in range(1, answer_after_steps + 1):
        streamer.tick(PERIOD * i)
        assert not streamer.want_request(PERIOD * i)  # one request in flight at a time
    now = PERIOD * answer_after_steps
    result = streamer.merge_chunk(now, now, chunk_times(), line(now + chunk_times()), 1)
    assert result.accepted and result.delay_steps == answer_after_steps
    wanted = []
    for i in range(answer_after_steps + 1, last_tick + 1):
        streamer.tick(PERIOD * i)
        if streamer.want_request(PERIOD * i):
            wanted.append(i)
    return wanted


def test_threshold_policy_requests_when_remaining_below_margin():
    streamer = make_streamer(margin_steps=5)
    # Plan ends at 0.2 s = step 50; remaining 50 - i < 0 + 5 from i = 46 on.
    assert run_request_scenario(streamer)[0] == 46


def test_threshold_policy_adds_the_expected_delay():
    streamer = make_streamer(margin_steps=5)
    # Delay 10 steps; plan ends at 0.04 + 0.2 s = step 60; 60 - i < 10 + 5 from i = 46 on.
    assert run_request_scenario(streamer, answer_after_steps=10)[0] == 46
    assert streamer_metrics(streamer)["expected_delay_steps"] == 10


def test_continuous_policy_requests_back_to_back():
    streamer = make_streamer(request_policy="continuous")
    assert run_request_scenario(streamer, answer_after_steps=3)[0] == 4


def test_sync_mode_requests_only_when_the_chunk_is_done():
    streamer = make_streamer(mode="sync", request_policy="continuous")
    assert run_request_scenario(streamer)[0] == 50


def test_request_carries_the_remaining_plan_and_times_out():
    streamer = make_streamer(request_timeout_s=0.5, request_policy="continuous")
    run_request_scenario(streamer, last_tick=24)
    streamer.tick(0.1)  # command time 0.1: actions at 0.12 ... 0.2 s are still to run
    request = streamer.make_request(0.1)
    assert request.request_id == 2 and request.stamp == 0.1
    np.testing.assert_allclose(request.times_from_start, [0.02, 0.04, 0.06, 0.08, 0.1])
    plan = streamer.plan  # what will run: the chunk blended in from the start-up hold
    still_to_run = plan.is_action & (plan.times > 0.1)
    np.testing.assert_array_equal(request.positions, plan.positions[still_to_run])
    assert not streamer.want_request(0.6)
    assert streamer.want_request(0.61)  # no answer within 0.5 s: ask again
    assert streamer_metrics(streamer)["requests_timed_out"] == 1


def test_a_refused_request_is_asked_again_at_once_not_after_the_timeout():
    streamer = make_streamer(request_timeout_s=2.0, margin_steps=5)
    assert run_request_scenario(streamer)[0] == 46
    request = streamer.make_request(PERIOD * 46)
    assert request.request_id == 2
    assert not streamer.request_refused(1)  # not the pending one: nothing changes
    assert not streamer.want_request(PERIOD * 47)
    assert streamer.request_refused(2)  # its chunk was vetoed: no answer is coming
    assert streamer.want_request(PERIOD * 47)
    assert streamer.make_request(PERIOD * 47).request_id == 3
    metrics = streamer_metrics(streamer)
    assert metrics["requests_refused"] == 1 and metrics["requests_timed_out"] == 0


def test_no_progress_when_the_clock_does_not_advance():
    streamer = make_streamer()
    first = streamer.tick(1.0)
    again = streamer.tick(1.0)
    back = streamer.tick(0.5)
    assert first.time == again.time == back.time == 1.0
    assert streamer_metrics(streamer)["steps"] == 1


def test_config_validation():
    for bad in ({"mode": "fast"}, {"request_policy": "x"}, {"control_period_s": 0.0},
                {"blend_window_s": -1.0}, {"margin_steps": -1},
                {"driver_delay_s": 0.02, "arm_only_delay_s": 0.03}):  # fmt: skip
        with pytest.raises(ValueError):
            StreamerConfig(**bad)


def test_resync_moves_only_a_held_command_to_the_measured_arm():
    from vla_runtime.core.interpolation import Limits

    limits = Limits(
        velocity=np.full(3, 2.0), acceleration=np.full(3, 10.0), jerk=np.full(3, 5000.0)
    )
    streamer = ActionStreamer(StreamerConfig(), limits, [0.0, 0.0, 0.04], arm_dof=2)
    streamer.tick(1.0)  # no plan: holding at rest
    at_rest = [0.0, 0.0]
    assert not streamer.resync([0.02, 0.0], at_rest, tolerance=0.03)  # within tolerance
    assert not streamer.resync([0.2, -0.1], [0.3, 0.0], tolerance=0.03)  # arm still moving
    assert streamer.resync([0.2, -0.1], at_rest, tolerance=0.03)
    np.testing.assert_array_equal(streamer.tick(1.004).position, [0.2, -0.1, 0.04])
    assert streamer_metrics(streamer)["resyncs"] == 1
    # While a plan runs, the arm may lag the command: no resync.
    times = np.arange(1, 11) * 0.05
    positions = np.column_stack([np.linspace(0.2, 0.3, 10), np.full(10, -0.1), np.full(10, 0.04)])
    streamer.merge_chunk(1.004, 1.004, times, positions)
    streamer.tick(1.008)
    assert not streamer.resync([0.5, 0.5], at_rest, tolerance=0.03)
