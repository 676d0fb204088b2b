"""Command gate latches: faults, reset re-arming from the measured state, restored latches and
the divergence stop."""

from __future__ import annotations

import numpy as np
import pytest
from test_gate import HOME, ROBOT, Run, T, armed_run, assert_within_limits

from vla_runtime.core.safety.gate import (
    ESTOP,
    RUNNING,
    STOPPING,
    WAITING,
    CommandGate,
    GateConfig,
)


def moving_run(joint=0, distance=0.5, ticks=20) -> tuple[Run, np.ndarray]:
    run = armed_run()
    goal = HOME.copy()
    goal[joint] += distance
    for _ in range(ticks):
        run.send(goal)
        run.tick()
    return run, goal


def test_a_fault_latches_decelerates_and_names_itself_in_rejections():
    run, goal = moving_run()
    run.gate.fault(run.now, "reflex", joint_index=3)
    assert run.gate.latched == "reflex" and run.gate.mode == ESTOP
    for _ in range(100):
        assert not run.send(goal)
        run.tick()
    fault = run.event("fault")
    assert fault["fault"] == "reflex" and fault["joint_index"] == 3
    assert fault["speed_rad_s"] > 0.5
    assert run.event("command_rejected")["reason"] == "fault 'reflex' latched"
    assert not run.gate.moving and run.event("stopped")["mode"] == ESTOP
    assert_within_limits(run.outputs)
    run.gate.estop(run.now)  # a second latch keeps the first one's name
    assert run.gate.latched == "reflex"


def test_after_fault_and_reset_the_gate_rearms_from_the_measured_state_only():
    run, goal = moving_run()
    run.gate.fault(run.now, "protective_stop")
    run.tick(100)
    held = run.outputs[-1].copy()
    # The arm was moved away while latched (a protective stop, a person): 0.2 rad off.
    measured = held.copy()
    measured[0] -= 0.2
    run.gate.update_state(measured, run.now, now=run.now)
    assert run.gate.reset(run.now)
    assert run.gate.mode == WAITING and run.gate.latched is None
    assert run.gate.output is None and run.gate.target is None
    assert not run.gate.moving
    assert not run.send(held)  # agrees with the old output, not with the arm
    run.tick(state=False)
    assert "rad from the arm" in run.events[-1]["reason"]
    assert run.outputs[-1] is not None and len(run.outputs) == 121  # nothing sent since
    assert run.send(measured)
    run.tick(state=False)
    np.testing.assert_allclose(run.outputs[-1], measured, atol=1e-3)  # from the arm, at rest
    assert run.gate.mode == RUNNING
    assert run.event("estop_reset")["latched"] == "protective_stop"


def test_reset_while_braking_lets_the_output_come_to_rest_first():
    run, goal = moving_run(ticks=40)
    run.gate.estop(run.now)
    run.tick()
    assert run.gate.moving
    assert run.gate.reset(run.now)
    assert run.gate.mode == STOPPING and run.gate.latched is None
    assert not run.send(run.outputs[-1])  # no arming from the old output while braking
    run.tick(100)
    assert run.gate.mode == WAITING and run.gate.output is None
    assert_within_limits(run.outputs)
    assert run.send(run.outputs[-1])  # the arm (the test's state) stands where it stopped


def test_reset_without_a_latch_changes_nothing():
    run, _ = moving_run()
    assert not run.gate.reset(run.now)
    assert run.gate.mode == RUNNING and run.gate.output is not None


def test_an_unlatched_stop_holds_and_rearms_from_the_output():
    run, goal = moving_run()
    run.gate.estop(run.now, latched=False)
    assert run.gate.latched is None and run.gate.mode == STOPPING
    run.tick(60)
    assert not run.gate.moving
    assert run.send(run.outputs[-1])


def test_a_restored_latch_refuses_commands_until_reset():
    gate = CommandGate(ROBOT, GateConfig(control_period_s=T), latched="estop")
    assert gate.latched == "estop" and gate.mode == ESTOP
    gate.update_state(HOME, 1.0, now=1.0)
    assert not gate.command(HOME, None, 1.0, 1.0)
    assert gate.tick(1.004).arm is None
    assert gate.reset(1.01)
    assert gate.command(HOME, None, 1.01, 1.01)
    assert gate.tick(1.012).arm is not None

    run = armed_run()
    run.gate.restore_latch("divergence", run.now)
    assert run.gate.output is None and run.gate.latched == "divergence"
    assert not run.send(HOME)
    run.tick(state=False)
    assert run.event("latch_restored")["latched"] == "divergence"


def test_new_episode_keeps_a_fault_latched():
    run, _ = moving_run()
    run.gate.fault(run.now, "rogue_publisher", publisher="/x")
    run.gate.new_episode(run.now)
    assert run.gate.latched == "rogue_publisher" and run.gate.mode == ESTOP


def test_an_arm_that_does_not_follow_latches_divergence():
    run = armed_run()
    goal = HOME.copy()
    goal[2] += 1.0
    stuck = HOME.copy()  # the arm stays where it was armed
    for _ in range(200):
        if run.gate.latched:
            break
        run.send(goal)
        run.k += 1
        run.gate.update_state(stuck, run.now, now=run.now)
        out = run.gate.tick(run.now)
        run.events += out.events
        if out.arm is not None:
            run.outputs.append(out.arm)
    assert run.gate.latched == "divergence"
    fault = run.event("fault")
    assert fault["joint"] == ROBOT.joints[2] and fault["states"] >= 3
    # The output left the arm: even the output of 0.3 s before (the lag allowed) ran more than
    # 0.1 rad ahead of it, for at least 3 states over 20 ms.
    assert fault["error_rad"] > 0.1
    q = np.array(run.outputs)[:, 2]
    first_beyond = int(np.argmax(np.abs(q - stuck[2]) > 0.1))
    latched_at = len(q) - 1
    window = round(0.3 / T)
    assert window + 3 <= latched_at - first_beyond <= window + int(0.02 / T) + 2
    assert run.gate.mode == ESTOP


def test_an_arm_lagging_its_output_is_no_divergence():
    """The arm follows 0.2 s late (franky-sim lags ~0.13 s at full speed): no fault."""
    run = armed_run()
    goal = HOME.copy()
    goal[0] += 2.0
    lag = int(0.2 / T)
    for _ in range(400):
        run.send(goal)
        run.k += 1
        measured = run.outputs[max(0, len(run.outputs) - lag)] if run.outputs else HOME
        run.gate.update_state(measured, run.now, now=run.now)
        out = run.gate.tick(run.now)
        run.events += out.events
        run.outputs.append(out.arm)
    speed = np.abs(np.diff(np.array(run.outputs)[:, 0])).max() / T
    assert speed == pytest.approx(2.619, rel=1e-3)  # it went at full speed
    assert run.gate.latched is None and run.gate.mode == RUNNING


def _diverge_by_a_reset(run) -> float:
    """States of an arm put back elsewhere (a simulator's reset) reach the gate before the
    episode's announcement does: it latches divergence. Returns the reset's stamp."""
    reset_at = run.now + T / 2
    moved = run.outputs[-1].copy()
    moved[1] -= 0.4
    for _ in range(10):
        if run.gate.latched:
            break
        run.k += 1
        run.gate.update_state(moved, run.now, now=run.now)
        run.events += run.gate.tick(run.now).events
    assert run.gate.latched == "divergence"
    return reset_at


def test_a_divergence_that_was_the_resets_own_move_clears_with_the_episode():
    run, _ = moving_run()
    reset_at = _diverge_by_a_reset(run)
    run.gate.new_episode(run.now, start=reset_at)
    assert run.gate.latched is None and run.gate.mode == WAITING
    run.tick(state=False)  # its events leave with the next tick
    assert run.event("divergence_cleared")["since"] >= reset_at


def test_a_divergence_from_before_the_reset_or_with_no_move_announced_holds():
    run, _ = moving_run()
    reset_at = _diverge_by_a_reset(run)
    run.gate.new_episode(run.now)  # an operator's episode: nothing says the arm was moved
    assert run.gate.latched == "divergence"
    run, _ = moving_run()
    reset_at = _diverge_by_a_reset(run)
    run.gate.new_episode(run.now, start=reset_at + 10 * T)  # it began before the reset
    assert run.gate.latched == "divergence" and run.gate.mode == ESTOP
