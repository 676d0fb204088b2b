"""Command gate with a geometry: TCP speed per step, and the braking path kept clear of
violations (a toy geometry: joint 1 must stay below 0.5 rad, the "table")."""

from __future__ import annotations

import numpy as np
from test_gate import HOME, ROBOT, T

from vla_runtime.core.safety.gate import RUNNING, CommandGate, GateConfig

TABLE = 0.5  # rad of joint 1 above which the toy arm is "below the table"
METRES_PER_RAD = 0.5  # the toy TCP moves 0.5 m per rad of joints 1 and 2


class ToyGeometry:
    def __init__(self, tcp_speed_limit: float | None = 0.25):
        self.tcp_speed_limit = tcp_speed_limit

    def position_violation(self, q) -> str | None:
        if q[0] > TABLE:
            return f"table: {q[0] - TABLE:.3f} m below"
        if 1.0 < q[2] < 1.2:  # a slab of joint 3
            return f"keep-out box: {min(q[2] - 1.0, 1.2 - q[2]):.3f} m inside"
        return None

    def position_violations(self, qs) -> list[str | None]:
        return [self.position_violation(q) for q in np.asarray(qs)]

    def tcp_speed(self, q_from, q_to, dt: float) -> float:
        return float(np.linalg.norm((np.asarray(q_to) - q_from)[:2])) * METRES_PER_RAD / dt


def drive(start, goal, ticks, geometry=None, **config):
    gate = CommandGate(ROBOT, GateConfig(control_period_s=T, event_interval_s=0.0, **config),
                       geometry=geometry or ToyGeometry())  # fmt: skip
    outputs, events = [], []
    gate.update_state(start, 0.0, now=0.0)
    assert gate.command(start, None, 0.0, 0.0)
    for k in range(1, ticks + 1):
        now = k * T
        gate.update_state(gate.output if gate.output is not None else start, now, now=now)
        gate.command(goal, None, now, now)
        out = gate.tick(now)
        events += out.events
        if out.arm is not None:
            outputs.append(out.arm)
    return gate, np.array(outputs), events


def test_a_target_below_the_table_is_approached_only_as_far_as_is_safe():
    start = HOME.copy()
    start[0] = 0.0
    goal = start.copy()
    goal[0] = 1.0
    gate, q, events = drive(start, goal, 400, geometry=ToyGeometry(None))
    assert (q[:, 0] <= TABLE).all()  # never into the violation
    assert q[-1, 0] > TABLE - 0.02  # but close to it
    assert np.abs(np.diff(q[-20:, 0])).max() < 1e-3  # and held there
    holds = [e for e in events if e["event"] == "geometry_hold"]
    assert holds and holds[0]["reason"].startswith("table:")
    assert gate.mode == RUNNING


def test_tcp_speed_is_held_to_the_limit():
    start = HOME.copy()
    start[0] = -1.0
    goal = start.copy()
    goal[0], goal[1] = 0.3, start[1] + 1.0
    _, q, events = drive(start, goal, 300)
    speed = np.linalg.norm(np.diff(q[:, :2], axis=0), axis=1) * METRES_PER_RAD / T
    assert speed.max() <= 0.25 * (1 + 1e-6)
    assert speed.max() > 0.24  # it went at the limit, not below it
    assert any(e["event"] == "tcp_speed_limited" for e in events)
    # Without the geometry the same move runs at up to 2.36 rad/s on both joints.
    free = CommandGate(ROBOT, GateConfig(control_period_s=T))
    assert free.geometry is None


def test_an_output_in_violation_leaves_only_toward_a_clear_target():
    start = HOME.copy()
    start[0] = 0.6  # the arm started "below the table"
    deeper = start.copy()
    deeper[0] = 1.0
    _, q, events = drive(start, deeper, 50)
    np.testing.assert_allclose(q[:, 0], 0.6)  # held: the target is in violation too
    assert any(e["event"] == "geometry_hold" for e in events)
    clear = start.copy()
    clear[0] = 0.0
    _, q, _ = drive(start, clear, 300)
    assert q[-1, 0] < 0.05  # it got out
    # A clear target reached through another kind of violation is held as well.
    through_box = clear.copy()
    through_box[2] = 1.4
    _, q, _ = drive(start, through_box, 300)
    assert (q[:, 2] <= 1.0).all()
    assert q[-1, 0] < 0.05  # joint 1 still got out of the table
