"""Chunk check verdicts with exact numbers (FR3 limits, default workcell)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_runtime.core.kinematics import FRANKA, solve_ik
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.chunk_check import (
    ACCEPT,
    CLIP,
    STALE,
    VETO,
    Chunk,
    ChunkCheckConfig,
    ChunkChecker,
)
from vla_runtime.core.safety.workspace import Box, Workcell

ROBOT = load_robot("fr3")
ARM = ROBOT.joints
HOME = np.array(ROBOT.home)
STAMP, NOW, STATE_STAMP = 10.0, 10.05, 10.04
DT = 0.1


def checker(**config) -> ChunkChecker:
    """At the full limits unless told otherwise, so the scaling arithmetic reads plainly."""
    return ChunkChecker(ROBOT, FRANKA, ChunkCheckConfig(**{"limit_fraction": 1.0, **config}))


def chunk(arm: np.ndarray, gripper=None, stamp=STAMP, dt=DT, names=ARM) -> Chunk:
    rows = np.asarray(arm, dtype=float)
    if gripper is not None:
        rows = np.column_stack([rows, gripper])
        names = (*names, ROBOT.gripper_joints[0])
    times = tuple(dt * k for k in range(len(rows)))
    return Chunk(tuple(names), stamp, times, tuple(map(tuple, rows)))


def ramp(joint: int, velocity: float, n: int = 10, start=HOME) -> np.ndarray:
    arm = np.tile(start, (n, 1))
    arm[:, joint] += velocity * DT * np.arange(n)
    return arm


def check(c: Chunk, state=HOME, now=NOW, state_stamp=STATE_STAMP, **config):
    return checker(**config).check(c, now, state, state_stamp)


def test_still_chunk_is_accepted_unchanged():
    c = chunk(np.tile(HOME, (10, 1)), gripper=np.full(10, 0.04))
    v = check(c)
    assert v.decision == ACCEPT and v.reasons == ()
    assert v.numbers["velocity_ratio"] == 0.0 and v.numbers["start_jump_rad"] == 0.0
    assert v.numbers["observation_age_s"] == pytest.approx(0.05)
    np.testing.assert_array_equal(v.times, c.times)
    np.testing.assert_array_equal(v.positions, np.asarray(c.positions))


def test_joint_order_may_differ_from_the_robot():
    arm = ramp(6, 1.0)
    names = tuple(reversed(ARM))
    v = check(chunk(arm[:, ::-1], names=names))
    assert v.decision == ACCEPT
    assert v.numbers["velocity_ratio"] == pytest.approx(1.0 / 5.26)


def test_too_fast_joint_is_slowed_by_the_velocity_ratio():
    # Joint 7 spins about the flange axis, so the TCP stays put: only the joint limit binds.
    v = check(chunk(ramp(6, 6.0, n=4), stamp=NOW))
    assert v.decision == CLIP
    scale = 6.0 / 5.26
    assert v.numbers["time_scale"] == pytest.approx(scale)
    np.testing.assert_allclose(v.times, DT * scale * np.arange(4))
    velocity = np.diff(v.positions[:, 6]) / np.diff(v.times)
    assert np.abs(velocity).max() == pytest.approx(5.26)


def test_far_too_fast_joint_is_vetoed():
    v = check(chunk(ramp(6, 6.0 * 3.0, n=2), stamp=NOW))
    assert v.decision == VETO and v.positions is None
    assert v.numbers["time_scale"] == pytest.approx(18.0 / 5.26)
    assert "velocity_ratio" in v.reasons[0]


def test_acceleration_scales_with_the_square_root():
    # q = a t^2 / 2 with a = 20 rad/s^2: finite differences are exact for a parabola.
    t = DT * np.arange(4)
    arm = np.tile(HOME, (4, 1))
    arm[:, 6] += 0.5 * 20.0 * t**2
    v = check(chunk(arm, stamp=NOW))
    assert v.numbers["acceleration_ratio"] == pytest.approx(2.0)
    assert v.numbers["jerk_ratio"] == pytest.approx(0.0, abs=1e-9)
    assert v.decision == CLIP and v.numbers["time_scale"] == pytest.approx(math.sqrt(2.0))
    # stretched from its first action, which keeps its time
    np.testing.assert_allclose(v.times, math.sqrt(2.0) * t)


def test_only_the_actions_still_to_run_are_timed():
    # A jump between the first action, already past, and the second: it never runs, so it
    # slows nothing down; slowing the rest keeps the past action in the past.
    arm = ramp(0, 0.5, n=6)
    arm[0, 0] -= 0.2  # 2.5 rad/s, then 0.5: 20 rad/s^2
    passed = check(chunk(arm))  # action 0 is 0.05 s old
    assert passed.decision == ACCEPT and passed.numbers["acceleration_ratio"] < 1.0
    runs = check(chunk(arm, stamp=NOW), state=arm[0], state_stamp=NOW)  # when it runs
    assert runs.numbers["acceleration_ratio"] > 1.0
    fast = ramp(0, 1.0, n=6)  # a TCP speed above the limit
    fast[0, 0] = fast[1, 0] - 0.05
    slowed = check(chunk(fast), state=fast[1], state_stamp=NOW)
    # The passed action stays in the past, a knot at now anchors the stretch, the rest is slowed.
    assert slowed.decision == CLIP and len(slowed.times) == 7
    assert slowed.times[0] == 0.0 and slowed.times[1] == pytest.approx(NOW - STAMP)
    scale = slowed.numbers["time_scale"]
    assert slowed.times[2] == pytest.approx(0.05 + 0.05 * scale)
    assert slowed.positions[2][0] == fast[1, 0]


def test_jerk_scales_with_the_cube_root():
    # q = j t^3 / 6 with j = 40000 rad/s^3 over 10 ms steps: jerk ratio 8, velocity below 1.
    dt = 0.01
    t = dt * np.arange(5)
    arm = np.tile(HOME, (5, 1))
    arm[:, 6] += 40000.0 * t**3 / 6.0
    v = check(chunk(arm, dt=dt, stamp=NOW))
    assert v.numbers["jerk_ratio"] == pytest.approx(8.0)
    # acceleration at the last interior point: 40000 * 0.03 = 1200 -> ratio 120 -> veto.
    assert v.decision == VETO and v.numbers["acceleration_ratio"] == pytest.approx(120.0)


def test_tcp_speed_above_collaborative_limit_is_slowed_below_it():
    # Joint 1 at 1 rad/s swings the TCP (0.30689 m from the axis) at ~0.307 m/s > 0.25 m/s;
    # the chunk is slowed to 90 % of the limit, 0.225 m/s.
    v = check(chunk(ramp(0, 1.0)))
    chord_speed = 2 * 0.306891 * math.sin(0.05) / DT
    assert v.numbers["tcp_speed_mps"] == pytest.approx(chord_speed, rel=1e-5)
    assert v.decision == CLIP
    assert v.numbers["time_scale"] == pytest.approx(chord_speed / 0.225, rel=1e-5)
    tcp = FRANKA.tcp_position(v.positions)
    speed = np.linalg.norm(np.diff(tcp, axis=0), axis=1) / np.diff(v.times)
    runs = v.times[1:] > NOW - STAMP + 1e-9  # segments still to run
    # The knot at now halves one arc: its chord runs a hair (8e-5) faster than the whole one's.
    assert speed[runs].max() == pytest.approx(0.225, rel=5e-4)


def test_joint_limit_truncates_before_the_first_offending_point():
    # Joint 7 from 2.6 at 0.5 rad/s passes 3.0159 - 0.1 margin at point 7 (2.95).
    start = HOME.copy()
    start[6] = 2.6
    v = check(chunk(ramp(6, 0.5, start=start)), state=start)
    assert v.decision == CLIP and len(v.times) == 7
    assert v.numbers["first_violation_index"] == 7
    assert "joint limit fr3_joint7" in v.reasons[0]


def test_keep_out_box_truncates_where_the_tcp_enters():
    # Joint 1 at 0.2 rad/s: the TCP (radius 0.30689 m, z 0.487) reaches y = 0.1 at
    # asin(0.1 / 0.30689) = 0.3319 rad, i.e. at point 17 (0.34 rad). The hand's outline is no
    # keep-out point (the margin covers the hand).
    box = Box((0.2, 0.1, 0.45), (0.4, 0.2, 0.52), "bin")
    v = check(chunk(ramp(0, 0.2, n=30)), workcell=Workcell(keep_out=(box,), keep_out_margin=0.0))
    assert v.decision == CLIP and len(v.times) == 17
    assert "keep-out box bin" in v.reasons[0]
    # With the default 12 cm margin for the links' and the hand's width the hand stops short: a
    # box from y = 0.15 is entered by the TCP's (and the flange's) point at y = 0.03,
    # asin(0.03 / 0.30689) = 0.0979 rad, i.e. at point 5 (0.10 rad); without it at
    # asin(0.15 / 0.30689) = 0.5108 rad, point 26.
    box = Box((0.2, 0.15, 0.45), (0.4, 0.25, 0.52), "bin")
    v = check(chunk(ramp(0, 0.2, n=30)), workcell=Workcell(keep_out=(box,)))
    assert v.decision == CLIP and len(v.times) == 5
    v = check(chunk(ramp(0, 0.2, n=30)), workcell=Workcell(keep_out=(box,), keep_out_margin=0.0))
    assert v.decision == CLIP and len(v.times) == 26


def test_violation_at_the_start_is_a_veto():
    box = Box((0.25, -0.05, 0.45), (0.35, 0.05, 0.52), "around home")
    v = check(chunk(np.tile(HOME, (10, 1))), workcell=Workcell(keep_out=(box,)))
    assert v.decision == VETO and v.numbers["first_violation_index"] == 0


def test_workcell_geometry_table_workspace_and_self_clearance():
    cell = Workcell()
    arm = np.array([[[0.5, 0.0, 0.3], [0.5, 0.0, 0.004]]])  # one point 4 mm above the table
    hand = np.array([[[0.5, 0.0, 0.3], [1.0, 0.0, 0.3]], [[0.05, 0.05, 0.2], [0.5, 0, 0.3]]])
    found = {name: (mask.tolist(), worst) for name, mask, worst in cell.violations(arm, hand)}
    assert found["table clearance"] == ([True], pytest.approx(0.001))
    assert found["workspace plane x <= 0.95"] == ([True, False], pytest.approx(0.05))
    mask, radius = found["self clearance (hand over the base)"]
    assert mask == [False, True] and radius == pytest.approx(math.hypot(0.05, 0.05))


def test_gripper_out_of_range_is_clamped():
    v = check(chunk(np.tile(HOME, (10, 1)), gripper=np.linspace(0.03, 0.05, 10)))
    assert v.decision == CLIP and v.positions[:, 7].max() == 0.04
    assert v.numbers["gripper_clamp_m"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda c: Chunk(c.joint_names, c.stamp, c.times, ((math.nan,) * 7,) + c.positions[1:]),
         "non-finite"),
        (lambda c: Chunk(c.joint_names, c.stamp, c.times, (c.positions[0][:6],) + c.positions[1:]),
         "malformed"),
        (lambda c: Chunk(c.joint_names[:6], c.stamp, c.times, c.positions), "missing"),
        (lambda c: Chunk(c.joint_names[:6] + ("j_x",), c.stamp, c.times, c.positions), "unknown"),
        (lambda c: Chunk(c.joint_names, c.stamp, (0.0, 0.0) + c.times[2:], c.positions),
         "increase by at least"),
        (lambda c: Chunk(c.joint_names, c.stamp, (0.0, 1e-9) + c.times[2:], c.positions),
         "increase by at least"),
        (lambda c: Chunk(c.joint_names, c.stamp, c.times[:5], c.positions), "shape"),
        (lambda c: Chunk(c.joint_names, c.stamp + 1.0, c.times, c.positions), "future"),
        (lambda c: Chunk(c.joint_names, math.inf, c.times, c.positions), "non-finite"),
    ],
)  # fmt: skip
def test_malformed_chunks_are_vetoed(mutate, reason):
    v = check(mutate(chunk(np.tile(HOME, (10, 1)))))
    assert v.decision == VETO and reason in v.reasons[0]


def test_old_observation_and_fully_past_chunks_are_stale():
    still = np.tile(HOME, (10, 1))
    assert check(chunk(still), now=STAMP + 1.01).decision == STALE
    v = check(chunk(still), now=STAMP + 0.95, state_stamp=STAMP + 0.94)
    assert v.decision == STALE and "already past" in v.reasons[0]


def test_start_continuity_allows_what_max_velocity_reaches():
    # First live point is t = 0.1 (applies at 10.1), state measured at 10.04: joint 1 may be
    # 0.05 + 2.62 * 0.06 = 0.2072 rad away.
    state = HOME.copy()
    state[0] -= 0.2
    assert check(chunk(np.tile(HOME, (10, 1))), state=state).decision == ACCEPT
    state[0] = HOME[0] - 0.21
    v = check(chunk(np.tile(HOME, (10, 1))), state=state)
    assert v.decision == VETO and "allowed 0.207" in v.reasons[0]
    assert v.numbers["start_jump_rad"] == pytest.approx(0.21)


def test_unknown_or_old_joint_state_is_a_veto():
    c = chunk(np.tile(HOME, (10, 1)))
    assert "unknown" in check(c, state=None, state_stamp=None).reasons[0]
    v = check(c, state_stamp=NOW - 0.3)
    assert v.decision == VETO and v.numbers["state_age_s"] == pytest.approx(0.3)


def test_event_carries_verdict_reasons_and_numbers():
    event = check(chunk(ramp(6, 6.0, n=4), stamp=NOW)).event()
    assert event["verdict"] == CLIP and event["time_scale"] == pytest.approx(6.0 / 5.26)
    assert event["reasons"][0].startswith("slowed down 1.141x: velocity_ratio")


def test_chunks_are_timed_against_a_fraction_of_the_limits():
    # joint 7 at 4.0 rad/s: inside its 5.26 rad/s limit, above 0.7 of it (3.682)
    times = (0.1, 0.2, 0.3)
    rows = [HOME + [0, 0, 0, 0, 0, 0, 4.0 * (t - 0.1)] for t in times]
    chunk = Chunk(tuple(ROBOT.joints), STAMP, times, tuple(map(tuple, rows)))
    full = checker(tcp_speed=10.0).check(chunk, NOW, HOME, STATE_STAMP)
    assert full.decision == "accept"
    planned = checker(limit_fraction=0.7, tcp_speed=10.0).check(chunk, NOW, HOME, STATE_STAMP)
    assert planned.decision == "clip"
    assert planned.numbers["time_scale"] == pytest.approx(4.0 / (0.7 * 5.26), rel=1e-6)
    with pytest.raises(ValueError, match="limit_fraction"):
        checker(limit_fraction=1.5)


def test_a_chunk_that_left_a_resting_arm_behind_starts_late_from_its_first_action():
    # The arm held at HOME while the chunk was computed; the chunk's first action is already
    # 0.12 rad along on joint 1 (moving at 1 rad/s), due 0.01 s from now: no action is within
    # reach, so it starts once the arm can get there at the planned velocity.
    times = tuple(0.05 * (k + 1) for k in range(16))
    rows = [HOME + [0.07 + 1.0 * t, 0, 0, 0, 0, 0, 0] for t in times]
    c = Chunk(tuple(ROBOT.joints), STAMP, times, tuple(map(tuple, rows)))
    now = STAMP + 0.04
    planned = checker(limit_fraction=0.7)
    late = planned.check(c, now, HOME, now - 0.004)
    assert late.decision == "clip" and "action 0 starts" in late.reasons[0]
    need = (0.12 - 0.05) / (0.7 * ROBOT.velocity[0])  # s to close the gap beyond tolerance
    start = max(now + 0.02, now - 0.004 + need)
    scale = late.numbers.get("time_scale", 1.0)  # stretched from now
    assert late.stamp + late.times[0] == pytest.approx(now + (start - now) * scale)
    assert late.numbers["retimed_s"] == pytest.approx(start - (STAMP + times[0]))
    assert (
        checker(limit_fraction=0.7, retime_behind=False).check(c, now, HOME, now - 0.004).decision
        == "veto"
    )
    # the same gap against the chunk's own motion (the arm is ahead of it): still a veto
    back = [HOME + [-0.07 - 1.0 * t, 0, 0, 0, 0, 0, 0] for t in times]
    c_back = Chunk(tuple(ROBOT.joints), STAMP, times, tuple(map(tuple, back)))
    ahead = HOME - [0.24, 0, 0, 0, 0, 0, 0]
    assert planned.check(c_back, now, ahead, now - 0.004).decision == "veto"
    # a start later than max_retime_s is a veto
    far = [HOME + [0.8 + 1.0 * t, 0, 0, 0, 0, 0, 0] for t in times]
    c_far = Chunk(tuple(ROBOT.joints), STAMP, times, tuple(map(tuple, far)))
    assert planned.check(c_far, now, HOME, now - 0.004).decision == "veto"


def test_a_chunk_the_arm_is_behind_starts_late_instead_of_joining_mid_way():
    # 1 rad/s on joint 1 from where the arm stands; the chunk arrives 0.3 s after its
    # observation, when its live part is 0.3 rad ahead of the arm
    times = tuple(0.05 * (k + 1) for k in range(16))
    rows = [HOME + [1.0 * t, 0, 0, 0, 0, 0, 0] for t in times]
    chunk = Chunk(tuple(ROBOT.joints), STAMP, times, tuple(map(tuple, rows)))
    now = STAMP + 0.3
    joined = checker(retime_behind=False).check(chunk, now, HOME, now - 0.004)
    assert joined.decision == "veto" and "discontinuous start" in joined.reasons[0]
    late = checker().check(chunk, now, HOME, now - 0.004)
    assert late.decision == "clip" and "re-timed" in late.reasons[0]
    # the latest passed action within reach (0.05 + 2.62 * 0.024 rad) starts 0.02 s from now
    k = int(late.reasons[0].split("action ")[1].split()[0])
    # (then slowed down from there for its TCP speed: the actions before it are left out)
    scale = late.numbers["time_scale"]  # stretched from now
    assert k == 1 and late.stamp + late.times[0] == pytest.approx(now + 0.02 * scale)
    assert late.positions[0] == pytest.approx(rows[1]) and "slowed down" in late.reasons[1]
    assert late.numbers["retimed_s"] == pytest.approx(now + 0.02 - (STAMP + times[1]))
    # an arm that is nowhere on the chunk's path is still a veto
    away = HOME + [0.0, 0.3, 0, 0, 0, 0, 0]
    assert checker().check(chunk, now, away, now - 0.004).decision == "veto"
    # a chunk the arm can join is left alone
    fresh = checker().check(chunk, STAMP + 0.06, HOME + [0.05, 0, 0, 0, 0, 0, 0], STAMP + 0.05)
    assert fresh.stamp == STAMP and "retimed_s" not in fresh.numbers


def test_time_scaling_is_anchored_at_now_and_past_actions_stay_past():
    # Joint 1 at 1 rad/s (TCP too fast): 0.05 s of it have passed when the check runs. Stretched
    # from the chunk's first point, the passed actions would come back into the future and the
    # streamer would command the arm back to them; from now, they stay behind it.
    c = chunk(ramp(0, 1.0, n=8))
    t_now = NOW - STAMP
    state = HOME + [t_now * 1.0, 0, 0, 0, 0, 0, 0]  # the arm is where the chunk is at now
    v = check(c, state=state)
    scale = v.numbers["time_scale"]
    assert v.decision == CLIP and scale > 1.0
    times, q = np.asarray(v.times), np.asarray(v.positions)[:, 0]
    future = times > t_now + 1e-9
    # nothing that runs lies behind where the chunk stands at now: no reversal
    here = np.interp(t_now, times, q)
    assert here == pytest.approx(state[0])
    assert (q[future] >= here - 1e-12).all() and (np.diff(q[future]) >= 0).all()
    # past points kept their times, the rest are stretched from now by the scale
    assert times[0] == 0.0
    np.testing.assert_allclose(times[future], t_now + (np.array(c.times)[1:] - t_now) * scale)
    # what runs is within the limits: the TCP speed on each segment still to run
    tcp = FRANKA.tcp_position(v.positions)
    speed = np.linalg.norm(np.diff(tcp, axis=0), axis=1) / np.diff(times)
    assert speed[times[1:] > t_now + 1e-9].max() <= 0.25 * (1 + 5e-4)


def test_an_arm_already_below_the_table_floor_may_stay_as_deep_or_rise_but_not_sink():
    # The TCP 3 mm up is 2 mm below the arm points' 5 mm floor: a grasp that went down to the
    # table. Chunks that hold that height or lift are let run; one that sinks 3 mm further is cut.
    def at(z):
        q, error = solve_ik(FRANKA, HOME, [0.5, 0.0, z], tolerance=1e-9)
        assert error < 1e-6
        return q

    def chunk_through(heights):
        times = tuple(0.1 * k for k in range(len(heights)))
        return Chunk(ROBOT.joints, 10.0, times, tuple(tuple(at(z)) for z in heights))

    checker = ChunkChecker(ROBOT, FRANKA, ChunkCheckConfig())
    low = at(0.003)
    rising = chunk_through([0.003, 0.003, 0.008, 0.020, 0.030])
    assert checker.check(rising, 10.0, low, 10.0).decision != VETO
    verdict = checker.check(chunk_through([0.003, 0.003, 0.0, 0.0, 0.0]), 10.0, low, 10.0)
    assert verdict.numbers["first_violation_index"] == 2
    assert "table clearance" in " ".join(verdict.reasons)
    # Measured clear of the table, the same first points are refused.
    assert checker.check(rising, 10.0, low, 10.0, state_table_depth=-0.01).decision == VETO
