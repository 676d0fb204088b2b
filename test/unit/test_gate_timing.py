"""Command gate and time: state age bounded on both sides, velocity per elapsed time, and the
position-dependent FR3 velocity limits."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_gate import HOME, ROBOT, Run, T, armed_run

from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.gate import RUNNING, STOPPING, CommandGate, GateConfig
from vla_runtime.core.safety.joint_velocity_limits import velocity_limits

A = np.array(ROBOT.acceleration)


def test_a_future_stamped_state_is_refused_and_cannot_blind_the_watchdog():
    run = armed_run(state_timeout_s=0.1)
    goal = HOME.copy()
    goal[0] += 0.3
    run.send(goal)
    run.tick(5)
    # One state stamped 10 s ahead, then silence on the state topic (commands keep coming).
    run.gate.update_state(run.outputs[-1], run.now + 10.0, now=run.now)
    last_state = run.now
    for _ in range(60):
        run.send(goal)
        run.tick(state=False)
        if run.gate.mode == STOPPING:
            break
    rejected = run.event("state_rejected")
    assert rejected["lead_s"] == pytest.approx(10.0) and "in the future" in rejected["reason"]
    lost = run.event("state_lost")
    assert lost["stamp"] - last_state <= 0.1 + T + 1e-9
    assert run.gate.mode == STOPPING


def test_a_state_within_the_lead_counts_but_its_receive_time_still_ages():
    run = armed_run(state_timeout_s=0.1, max_state_lead_s=0.05)
    run.gate.update_state(HOME, run.now + 0.04, now=run.now)  # clock skew: accepted
    assert "state_rejected" not in run.kinds()
    received = run.now
    for _ in range(60):
        run.send(HOME)
        run.tick(state=False)
    # The stamp alone would read 0.04 s younger; the receive time bounds the silence.
    assert run.event("state_lost")["stamp"] - received <= 0.1 + T + 1e-9


def test_without_now_the_latest_tick_is_the_reference():
    run = armed_run()
    run.gate.update_state(HOME, run.now + 1.0)
    run.tick(state=False)
    assert run.event("state_rejected")["lead_s"] == pytest.approx(1.0)
    assert run.gate.state_stamp <= run.now


def test_early_and_late_ticks_move_at_most_v_max_times_the_elapsed_time():
    run = armed_run(limit_fraction=1.0)
    goal = HOME.copy()
    goal[0] += 2.0
    now, outputs = run.now, []
    rng = np.random.default_rng(0)
    for _ in range(400):  # irregular ticks: 0.1 to 2 periods apart
        now += T * rng.uniform(0.1, 2.0)
        run.gate.update_state(run.gate.output, now, now=now)
        run.gate.command(goal, None, now, now)
        out = run.gate.tick(now)
        if out.arm is not None:
            outputs.append((now, out.arm))
    times = np.array([t for t, _ in outputs])
    q = np.array([o for _, o in outputs])
    elapsed = np.diff(times)
    assert elapsed.min() >= T * (1 - 1e-9)  # closer ticks sent nothing (limit_fraction 1)
    steps = np.abs(np.diff(q[:, 0]))
    v_limit = 2.62 - 0.001
    assert (steps <= v_limit * elapsed * (1 + 1e-9)).all()
    assert steps.max() > 0.9 * v_limit * T  # it did run at speed
    assert run.gate.mode == RUNNING


def test_an_early_tick_sends_nothing_and_a_late_one_one_step():
    run = armed_run(limit_fraction=0.9)  # a full step needs 0.9 T
    goal = HOME.copy()
    goal[0] += 2.0
    for _ in range(100):  # up to speed (0.26 s), far from braking
        run.send(goal)
        run.tick()
    v = run.gate.velocity[0]
    assert v == pytest.approx(0.9 * (2.62 - 0.001))
    t0 = run.now
    assert run.gate.tick(t0 + 0.85 * T).arm is None
    before = run.gate.output.copy()
    late = t0 + 3 * T
    run.gate.update_state(run.gate.output, late, now=late)
    run.gate.command(goal, None, late, late)
    out = run.gate.tick(late)
    assert out.arm[0] - before[0] == pytest.approx(v * T, rel=1e-6)
    soon = late + 0.9 * T  # a full step at 0.9 of the limit 0.9 T later: the limit itself
    run.gate.command(goal, None, soon, soon)
    again = run.gate.tick(soon)
    assert again.arm is not None
    assert (again.arm[0] - out.arm[0]) / (soon - late) <= (2.62 - 0.001) * (1 + 1e-6)


def test_fr3_joint2_slows_near_its_upper_end_as_libfranka_computes():
    run = armed_run(limit_fraction=1.0)
    start = HOME.copy()
    start[1] = 1.40
    run = Run(limit_fraction=1.0)
    run.state(start)
    assert run.send(start)
    run.tick(state=False)
    goal = start.copy()
    goal[1] = 1.6837  # the position limit less the margin
    speeds = []
    for _ in range(150):
        run.send(goal)
        run.tick(state=False)
        v = run.gate.velocity[1]
        q = run.outputs[-2][1]  # where the step started
        speeds.append((q, v))
    for q, v in speeds:
        q_full = start.copy()
        q_full[1] = q
        _, upper = velocity_limits("libfranka_fr3", q_full)
        assert v <= upper[1] + 1e-9
    # At 1.40 rad the flat limit would allow 2.62 rad/s; libfranka's formula gives 1.222.
    _, upper = velocity_limits("libfranka_fr3", start)
    assert upper[1] == pytest.approx(1.223, abs=1e-3)
    assert max(v for _, v in speeds) < 1.23


def test_with_the_default_fraction_the_bound_is_90_percent_of_the_position_limit():
    gate = CommandGate(ROBOT, GateConfig(control_period_s=T))
    q = HOME.copy()
    q[1] = 1.40
    down, up = gate._velocity_bounds(q)
    assert up[1] == pytest.approx(0.9 * (-0.20 + math.sqrt(5.17 * (1.7918 - 1.40)) - 0.001))
    assert down[1] == pytest.approx(0.9 * (2.62 - 0.001))


def test_ur5e_keeps_its_flat_limits():
    ur = load_robot("ur5e")
    gate = CommandGate(ur, GateConfig(control_period_s=T))
    down, up = gate._velocity_bounds(np.array(ur.home))
    np.testing.assert_allclose(up, 0.9 * np.array(ur.velocity))
    np.testing.assert_allclose(down, 0.9 * np.array(ur.velocity))
