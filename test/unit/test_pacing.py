"""Pacing the simulation: streams on the physics-step grid, steps due against wall time x the
real-time factor (rebasing when too far behind), and the achieved factor with its warning."""

import math

import pytest

from vla_runtime.core.pacing import FAST_BATCH_STEPS, PhysicsLoop, RtfMeter, StepGrid, WallPacer

DT = 0.001


class _Sim:
    """Counts steps; stops the loop after `until` of them."""

    def __init__(self, until: int):
        self.steps, self.until, self.published, self.loop = 0, until, [], None

    def step(self, n: int) -> None:
        self.steps += n

    def time(self) -> float:
        return self.steps * DT

    def publish(self, *due) -> None:
        self.published.append((self.steps, due))
        if self.steps >= self.until:
            self.loop.stop()


def _loop(sim, rtf=1.0, lockstep=False, **clock) -> PhysicsLoop:
    grid = StepGrid({"clock": 500.0, "state": 250.0}, 1000)
    sim.loop = PhysicsLoop(grid, DT, rtf, lockstep, sim.step, sim.time, sim.publish, print, **clock)
    return sim.loop


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


def test_a_lockstep_batch_publishes_on_the_grid_and_ends_with_every_stream():
    sim = _Sim(until=5)
    loop = _loop(sim, lockstep=True)
    loop.request(5)
    loop.run()
    # steps 2 and 4 on the grid, then step 5: the batch's end, both streams
    assert sim.published == [(2, (True, False)), (4, (True, True)), (5, (True, True))]
    assert loop.steps == 5


def test_free_running_follows_wall_time():
    wall = [0.0]
    sim = _Sim(until=100)
    loop = _loop(sim, clock=lambda: wall[0], sleep=lambda s: wall.__setitem__(0, wall[0] + s))
    loop.run()  # physics only advances as the (fake) wall clock does
    assert sim.steps == 100 and wall[0] == pytest.approx(0.1)


def test_free_running_wakes_once_per_publication_not_per_step():
    wall, sleeps = [0.0], []

    def sleep(s: float) -> None:
        sleeps.append(s)
        wall[0] += s

    sim = _Sim(until=100)
    loop = _loop(sim, clock=lambda: wall[0], sleep=sleep)
    loop.run()
    # clock every 2 steps: one sleep per publication (50), each of 2 steps of wall time
    assert sim.steps == 100 and len(sleeps) == 50
    assert sleeps[1:] == pytest.approx([2 * DT] * 49)
    assert [steps for steps, _ in sim.published] == list(range(2, 101, 2))


def test_a_zero_step_request_publishes_every_stream_again_and_free_running_refuses_requests():
    sim = _Sim(until=1)
    loop = _loop(sim, lockstep=True)
    assert loop.request(0)
    assert sim.published == [(0, (True, True))] and sim.steps == 0  # at once, no step taken
    free = _loop(_Sim(until=1))
    assert not free.request(5)
