"""The bench's judge: limit audit of driver commands, time to rest, chunk accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.audit import audit_commands, time_to_rest, unjudged_chunks
from vla_runtime.core.safety.gate import CommandGate, GateConfig

ROBOT = load_robot("fr3")
HOME = np.array(ROBOT.home)
T = 0.004


def gate_outputs(goal, ticks=300):
    gate = CommandGate(ROBOT, GateConfig(control_period_s=T))
    gate.update_state(HOME, 0.0)
    assert gate.command(HOME, None, 0.0, 0.0)
    outputs = []
    for k in range(1, ticks + 1):
        now = k * T
        gate.update_state(outputs[-1] if outputs else HOME, now)
        gate.command(goal, None, now, now)
        outputs.append(gate.tick(now).arm)
    return outputs


def test_the_gates_own_output_passes_and_a_single_bad_command_is_caught():
    goal = HOME + [0.8, 0, 0, -0.5, 0, 0, 0]
    outputs = gate_outputs(goal)
    clean = audit_commands(outputs, ROBOT, T)
    assert clean.commands == 300 and clean.unsafe == 0, clean
    assert 0.9 < clean.worst_ratio["acceleration"] <= 1 + 1e-6  # it does brake at the limit

    jumped = [o.copy() for o in outputs]
    jumped[150][3] += 0.02  # 5 rad/s for one step
    audit = audit_commands(jumped, ROBOT, T)
    assert audit.reasons["velocity"] == 2 and audit.unsafe >= 2

    wrong = [*outputs[:10], np.full(7, math.nan), outputs[10][:6], *outputs[11:]]
    assert audit_commands(wrong, ROBOT, T).reasons["malformed"] == 2

    beyond = [o.copy() for o in outputs]
    beyond[-1][0] = ROBOT.position_max[0] - 0.05  # inside the hard limit, inside the margin
    assert audit_commands(beyond, ROBOT, T).reasons["position"] == 1


def test_a_restarted_gate_is_judged_across_the_gap_by_the_time_it_held():
    first = gate_outputs(HOME + 0.3)[:100]
    second = [first[-1] + 0.01] * 20  # re-armed 0.01 rad away, after 2 s of holding
    joined = first + second
    assert audit_commands(joined, ROBOT, T).unsafe > 0  # as one stream: a 2.5 rad/s step
    audit = audit_commands(joined, ROBOT, T, segment_starts=[100], gaps_s=[2.0])
    assert audit.unsafe == 0, audit


def test_time_to_rest_needs_the_speed_to_stay_low():
    t = np.arange(0.0, 2.0, 0.004)
    v = np.where(t < 0.5, 0.3, 0.0)
    v[(t > 0.6) & (t < 0.65)] = 0.05  # a twitch 0.1 s into the rest: resting starts after it
    velocities = np.column_stack([v] + [np.zeros_like(t)] * 6)
    assert time_to_rest(t, velocities, after=0.2) == pytest.approx(0.452, abs=0.005)
    assert time_to_rest(t, velocities, after=0.2, hold_s=5.0) is None


def test_a_short_rest_counts_only_when_the_loop_resumed_on_purpose_within_it():
    t = np.arange(0.0, 1.0, 0.01)
    speed = np.where((t >= 0.3) & (t < 0.4), 0.0, 0.3)  # 100 ms at rest, then moving again
    velocities = speed[:, None] * np.ones((1, 3))
    assert time_to_rest(t, velocities, after=0.1) is None
    assert time_to_rest(t, velocities, after=0.1, resumed=[0.35]) == pytest.approx(0.2)
    assert time_to_rest(t, velocities, after=0.1, resumed=[0.6]) is None  # not within the rest
    turning = np.where((t >= 0.3) & (t < 0.33), 0.0, 0.3)  # a turning point, not a stop
    assert time_to_rest(t, turning[:, None] * np.ones((1, 3)), 0.1, resumed=[0.31]) is None


def test_every_sent_chunk_needs_one_verdict():
    assert unjudged_chunks([1.0, 2.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == [2]
    assert unjudged_chunks([1.0], [1.0, 4.0]) == []
    assert unjudged_chunks([0.1 + 0.2, 5.0], [0.3]) == [1]
