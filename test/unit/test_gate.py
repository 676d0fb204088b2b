"""Command gate: start-up rule, limits on the output sequence, watchdog, e-stop latch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.gate import ESTOP, RUNNING, STOPPING, WAITING, CommandGate, GateConfig

ROBOT = load_robot("fr3")
HOME = np.array(ROBOT.home)
T = 0.004
V, A = np.array(ROBOT.velocity), np.array(ROBOT.acceleration)
LOWER = np.array(ROBOT.position_min) + ROBOT.position_margin
UPPER = np.array(ROBOT.position_max) - ROBOT.position_margin


class Run:
    """Drives a gate tick by tick and records what it sends and reports."""

    def __init__(self, **config):
        config.setdefault("event_interval_s", 0.0)  # every event, so tests can read the last one
        config.setdefault("limit_fraction", 1.0)  # at the full limits, so numbers read plainly
        self.gate = CommandGate(ROBOT, GateConfig(control_period_s=T, **config))
        self.k = 0
        self.outputs: list[np.ndarray] = []
        self.grippers: list[tuple[float, float]] = []
        self.events: list[dict] = []

    @property
    def now(self) -> float:
        return self.k * T

    def state(self, q=HOME):
        self.gate.update_state(q, self.now)

    def send(self, q, width=None, age=0.0) -> bool:
        return self.gate.command(q, width, self.now - age, self.now)

    def tick(self, n=1, state=True):
        for _ in range(n):
            self.k += 1
            if state:
                self.state(self.outputs[-1] if self.outputs else HOME)
            out = self.gate.tick(self.now)
            self.events += out.events
            if out.arm is not None:
                self.outputs.append(out.arm)
            if out.gripper is not None:
                self.grippers.append((self.now, out.gripper))

    def kinds(self) -> list[str]:
        return [e["event"] for e in self.events]

    def event(self, kind: str) -> dict:
        return next(e for e in self.events if e["event"] == kind)


def assert_within_limits(outputs):
    q = np.array(outputs)
    assert (q >= LOWER - 1e-12).all() and (q <= UPPER + 1e-12).all()
    v = np.diff(q, axis=0) / T
    assert (np.abs(v) <= V * (1 + 1e-9)).all()
    a = np.diff(v, axis=0) / T
    assert (np.abs(a) <= A * (1 + 1e-6)).all()


def armed_run(**config) -> Run:
    run = Run(**config)
    run.state()
    assert run.send(HOME)
    run.tick()
    return run


def test_nothing_is_sent_until_state_is_known_and_the_command_agrees():
    run = Run()
    assert not run.send(HOME)  # no joint state yet
    run.tick(3, state=False)
    assert run.outputs == [] and run.gate.mode == WAITING
    assert run.event("arm_rejected")["reason"] == "joint state unknown"
    run.state()
    off = HOME.copy()
    off[3] += 0.06
    assert not run.send(off)
    run.tick()
    assert run.outputs == [] and "0.060 rad from the arm" in run.events[-1]["reason"]
    off[3] = HOME[3] + 0.04
    assert run.send(off)
    run.tick()
    assert run.gate.mode == RUNNING and run.event("armed")["gap_rad"] == pytest.approx(0.04)
    # The output starts from the measured state, not from the command.
    np.testing.assert_allclose(run.outputs[0][:3], HOME[:3])
    assert run.outputs[0][3] > HOME[3]


def test_smooth_commands_are_followed_within_one_tick():
    run = armed_run()
    # A parabola from rest with 5 rad/s^2 on joint 2: inside every limit.
    for k in range(1, 60):
        q = HOME.copy()
        q[1] += 0.5 * 5.0 * (k * T) ** 2
        run.send(q)
        run.tick()
    lag = np.abs(run.outputs[-1] - q).max()
    assert lag < 5.0 * 60 * T * T  # at most about one step behind
    assert "command_clamped" not in run.kinds()
    assert_within_limits(run.outputs)


def test_a_step_is_turned_into_a_bang_bang_move_without_overshoot():
    run = armed_run()
    goal = HOME.copy()
    goal[6] += 0.04
    run.send(goal)
    ticks = 0
    while np.abs(run.outputs[-1] - goal).max() > 1e-12:
        run.send(goal)
        run.tick()
        ticks += 1
        assert ticks < 200
    # Minimum time for 0.04 rad at 10 rad/s^2 from rest to rest: 2 sqrt(0.04 / 10) = 126.5 ms.
    assert 2 * math.sqrt(0.04 / 10.0) <= ticks * T <= 2 * math.sqrt(0.04 / 10.0) + 4 * T
    trace = np.array(run.outputs)[:, 6]
    # Velocity steps are not multiples of a_max T, so the discrete braking can miss by microns.
    assert trace.max() <= goal[6] + 2e-5 and (np.diff(trace)[:-1] >= 0).all()
    assert_within_limits(run.outputs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_garbage_never_produces_an_output_beyond_the_limits(seed):
    rng = np.random.default_rng(seed)
    run = armed_run()
    for _ in range(400):
        kind = rng.integers(5)
        q = run.outputs[-1] + rng.normal(0.0, 0.5, 7)
        if kind == 0:
            q = rng.uniform(-10.0, 10.0, 7)
        elif kind == 1:
            q[rng.integers(7)] = rng.choice([math.nan, math.inf, -math.inf])
        run.send(q)
        run.tick(int(rng.integers(1, 4)))
    assert_within_limits(run.outputs)
    assert run.gate.mode == RUNNING


def test_targets_beyond_the_position_limits_stop_at_the_margin():
    run = armed_run()
    far = HOME.copy()
    far[0] = 10.0
    for _ in range(800):
        run.send(far)
        run.tick()
    assert UPPER[0] - 10.0 * T * T <= run.outputs[-1][0] <= UPPER[0]
    assert run.event("command_clamped")["excess_rad"] == pytest.approx(10.0 - UPPER[0])
    assert_within_limits(run.outputs)


def test_rejected_commands_leave_the_target_alone():
    run = armed_run()
    bad = [
        ([math.nan] * 7, None, 0.0, "non-finite arm values"),
        (HOME[:6], None, 0.0, "6 arm values for 7 joints"),
        (HOME, math.inf, 0.0, "non-finite gripper width"),
        (HOME, None, 0.15, "stale command (0.150 s old)"),
        (HOME, None, -0.3, "command stamped 0.300 s in the future"),
    ]
    for q, width, age, reason in bad:
        run.gate._throttle.clear()
        assert not run.send(q, width, age=age)
        run.tick()
        assert run.events[-1]["reason"] == reason
    np.testing.assert_array_equal(run.gate.target, HOME)


def test_command_timeout_decelerates_to_rest_within_limits():
    run = armed_run()
    goal = HOME.copy()
    goal[6] += 1.0
    run.send(goal)
    last_command = run.now
    run.tick(60)  # 0.24 s: timeout after 0.09 s, while the joint is still speeding up
    timeout = run.event("command_timeout")
    limit = GateConfig().command_timeout_s
    ticks = math.floor(limit / T + 1e-9) + 1  # the first tick past the limit notices it
    assert timeout["stamp"] == pytest.approx(last_command + ticks * T)
    # Accelerating at 10 rad/s^2 for the ticks between the command and the detection.
    speed = timeout["speed_rad_s"]
    assert speed == pytest.approx(10.0 * (ticks - 1) * T)
    stopped = run.event("stopped")
    # The step ending at the detection tick already slows down: speed / a_max - T.
    assert stopped["decel_ms"] == pytest.approx(1e3 * (speed / 10.0 - T))
    assert stopped["stop_ms"] == pytest.approx(1e3 * limit + stopped["decel_ms"], abs=1e3 * T)
    assert run.gate.mode == STOPPING and not run.gate.moving
    held = run.outputs[-1]
    run.tick(10)
    np.testing.assert_array_equal(run.outputs[-1], held)
    assert_within_limits(run.outputs)
    # Resuming needs a command that agrees with where the output stands.
    assert not run.send(goal)
    assert run.send(held)


def test_estop_latches_until_an_explicit_reset():
    run = armed_run()
    goal = HOME.copy()
    goal[0] += 0.5
    for _ in range(20):
        run.send(goal)
        run.tick()
    run.gate.estop(run.now)
    for _ in range(100):
        assert not run.send(goal)
        run.tick()
    assert run.gate.mode == ESTOP and not run.gate.moving
    assert run.event("estop")["speed_rad_s"] > 0.5
    assert run.event("stopped")["mode"] == ESTOP
    assert_within_limits(run.outputs)
    run.gate.reset(run.now)
    assert run.gate.mode == WAITING
    assert not run.send(goal)  # far from the output: not re-armed
    assert run.send(run.outputs[-1])
    assert run.gate.mode == RUNNING
    run.tick()
    assert run.kinds().count("estop_reset") == 1


def test_lost_joint_state_stops_the_arm():
    run = armed_run(state_timeout_s=0.05)
    goal = HOME.copy()
    goal[2] += 0.3
    for _ in range(30):
        run.send(goal)
        run.tick(state=False)
    assert run.gate.mode == STOPPING and "state_lost" in run.kinds()
    assert not run.gate.moving


def test_gripper_width_is_rate_limited_and_sent_on_change_only():
    run = armed_run()
    run.send(HOME, width=0.08)
    run.tick()
    for _ in range(250):
        run.send(HOME, width=0.0)
        run.tick()
    times, widths = zip(*run.grippers, strict=True)
    assert widths[0] == 0.08 and widths[-1] == 0.0
    speeds = np.abs(np.diff(widths)) / np.diff(times)
    assert speeds.max() <= 0.1 + 1e-9  # the FR3 hand's max speed
    assert len(widths) < 250  # the deadband keeps the gripper topic quiet


def test_a_clock_jumping_backwards_does_not_blind_the_watchdog():
    run = armed_run()
    goal = HOME.copy()
    goal[0] += 0.5
    for _ in range(20):
        run.send(goal)
        run.tick()
    assert run.gate.moving
    run.k -= 500  # 2 s back: the last command now lies 2 s in the future; none follows
    run.tick(150)
    jump = run.event("clock_jump")
    assert jump["jump_s"] == pytest.approx(-2.0 + T)
    timeout = run.event("command_timeout")
    assert timeout["stamp"] - jump["stamp"] == pytest.approx(
        GateConfig().command_timeout_s, abs=T + 1e-9
    )
    assert run.gate.mode == STOPPING and not run.gate.moving
    assert_within_limits(run.outputs)


def test_clock_jumping_ahead_times_out_the_last_command():
    run = armed_run()
    goal = HOME.copy()
    goal[0] += 0.5
    for _ in range(20):
        run.send(goal)
        run.tick()
    run.k += 500
    assert not run.send(goal, age=2.0)  # stamped on the old clock: stale now
    run.tick(60)
    assert run.event("command_timeout")["silent_s"] >= 2.0
    assert not run.gate.moving
    assert_within_limits(run.outputs)


def test_output_keeps_a_margin_below_the_joint_limits():
    run = armed_run(limit_fraction=0.9)
    target = HOME.copy()
    target[0] += 1.0  # far: the output runs at its speed limit for a while
    for _ in range(300):
        run.send(target)
        run.tick()
    v = np.diff(np.array(run.outputs), axis=0) / T
    # libfranka's FR3 limit far from the ends: 2.62 less its 0.001 tolerance.
    assert np.abs(v[:, 0]).max() == pytest.approx(0.9 * (V[0] - 0.001), rel=1e-6)
    assert (np.abs(np.diff(v, axis=0)) / T <= 0.9 * A * (1 + 1e-6)).all()
    with pytest.raises(ValueError, match="limit_fraction"):
        CommandGate(ROBOT, GateConfig(limit_fraction=0.0))


def test_ticks_fired_back_to_back_are_skipped_unless_the_clock_runs_fast():
    from vla_runtime.core.safety.gate import TickPacer

    pacer = TickPacer(0.01)
    # real time: ticks every 10 ms, then a starved process fires three at once
    walls = [0.01 * k for k in range(200)] + [2.0, 2.0005, 2.001]
    due = [pacer.due(w, w) for w in walls]
    assert all(due[:200]) and due[200:] == [True, False, False] and pacer.skipped == 2
    # a simulation at 10x real time ticks every 1 ms of wall time: once its rate is measured
    # (two windows), every tick is due
    fast = TickPacer(0.01)
    due = [fast.due(0.001 * k, 0.01 * k) for k in range(3000)]
    assert fast.rate == pytest.approx(10.0) and all(due[1100:])
    # a starved process catching up on its clock (a slow window, then a fast one) keeps the
    # real-time spacing: its burst of ticks is still thinned out
    starved = TickPacer(0.01)
    for k in range(100):  # 1 s of real time
        starved.due(0.01 * k, 0.01 * k)
    starved.due(1.5, 1.0)  # a window in which the clock hardly advanced
    starved.due(2.0, 2.0)  # then one in which it jumped ahead
    assert starved.rate == 1.0
    burst = [starved.due(2.0 + 0.0005 * k, 2.0 + 0.004 * k) for k in range(1, 5)]
    assert burst.count(True) <= 1
