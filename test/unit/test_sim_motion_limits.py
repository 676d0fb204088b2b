"""Joint velocity / acceleration reflexes: the pure checks (core.motion_limits) and the
simulator refusing motion beyond the robot's limits on every command interface."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.motion_limits import (
    FIRST_STEP_DT_S,
    ForwardStream,
    Violation,
    effective_dt,
    forward_step_violation,
    trajectory_violation,
    worst_violation,
)
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.gate import CommandGate, GateConfig
from vla_runtime.core.trajectory import TrajectorySampler
from vla_runtime.sim.simulator import Simulator
from vla_runtime.sim.workcell import SceneConfig

FR3 = load_robot("fr3")
JOINTS = FR3.joints
V_LIMIT = np.array(FR3.velocity)  # fr3_joint2: 2.62 rad/s
A_LIMIT = np.array(FR3.acceleration)  # 10 rad/s^2
J2 = 1  # fr3_joint2


def one_joint(value: float, joint: int = J2) -> np.ndarray:
    out = np.zeros(len(JOINTS))
    out[joint] = value
    return out


# -- core.motion_limits ----------------------------------------------------------------------
def test_worst_violation_just_under_and_just_over_the_limit():
    # 1 % tolerance: 2.62 * 1.01 = 2.6462 rad/s
    assert worst_violation("velocity", JOINTS, one_joint(2.64), V_LIMIT) is None
    assert worst_violation("velocity", JOINTS, one_joint(-2.64), V_LIMIT) is None
    over = worst_violation("velocity", JOINTS, one_joint(-2.66), V_LIMIT)
    assert over == Violation("velocity", "fr3_joint2", 2.66, 2.62)
    # The joint with the worst ratio to its own limit is named (joint5's limit is 5.26).
    rows = np.array([one_joint(2.70), one_joint(5.30, joint=4)])
    assert worst_violation("velocity", JOINTS, rows, V_LIMIT).joint == "fr3_joint2"
    rows = np.array([one_joint(2.66), one_joint(5.50, joint=4)])
    assert worst_violation("velocity", JOINTS, rows, V_LIMIT).joint == "fr3_joint5"
    assert worst_violation("velocity", JOINTS, one_joint(np.nan), V_LIMIT) is not None


def test_reasons_name_the_reflex_like_the_robot():
    violation = Violation("velocity", "fr3_joint2", 3.0, 2.62)
    assert (
        violation.reason("fr3") == "joint_velocity_violation: fr3_joint2 3.00 rad/s > 2.62 (limit)"
    )
    accel = Violation("acceleration", "fer_joint2", 8.0, 7.5)
    assert accel.reason("panda").startswith("joint_acceleration_violation: fer_joint2 8.00 rad/s^2")
    ur = Violation("velocity", "elbow_joint", 3.5, 3.1416)
    assert ur.reason("ur5e") == "protective_stop: elbow_joint velocity 3.50 rad/s > 3.14 (limit)"


def test_forward_step_just_under_and_just_over_the_limit():
    start = np.array(FR3.home)
    ok = forward_step_violation(JOINTS, start, start + one_joint(0.0528), 0.02, V_LIMIT)
    assert ok is None  # 2.64 rad/s
    bad = forward_step_violation(JOINTS, start, start + one_joint(0.0532), 0.02, V_LIMIT)
    assert bad is not None and bad.joint == "fr3_joint2" and bad.value == pytest.approx(2.66)


def test_effective_dt_clamps_around_the_typical_interval():
    typical = [0.004] * 15
    assert effective_dt(0.0005, [*typical, 0.0005]) == pytest.approx(0.004)  # bunched
    assert effective_dt(0.006, [*typical, 0.006]) == pytest.approx(0.006)  # late: as it came
    assert effective_dt(0.05, [*typical, 0.05]) == pytest.approx(0.02)  # gap: 5 x 4 ms cap
    slow = [0.002] * 15
    assert effective_dt(0.03, [*slow, 0.03]) == pytest.approx(0.01)  # 5 x the median
    assert effective_dt(0.05, [0.05] * 16) == pytest.approx(0.02)  # never over 20 ms


def feed(stream: ForwardStream, arrivals, targets, q):
    """Judge and accept each command as the simulator does; the worst velocity judged."""
    worst = 0.0
    for arrival, target in zip(arrivals, targets, strict=True):
        start, dt = stream.judge(arrival, q)
        worst = max(worst, abs(target[J2] - start[J2]) / dt)
        assert forward_step_violation(JOINTS, start, target, dt, V_LIMIT) is None, (arrival, dt)
        stream.accepted(arrival, q)
        q = target
    return worst


def test_forward_stream_bunched_arrivals_do_not_trip():
    """A 250 Hz stream that speeds up at 10 rad/s^2 to 2.5 rad/s (95 % of the limit) and
    cruises, 15 % of its commands arriving up to 3.5 ms late (bunched with the next one)."""
    rng = np.random.default_rng(3)
    home = np.array(FR3.home)
    send_times = 0.004 * np.arange(0, 250)
    delays = np.where(
        rng.random(send_times.size) < 0.15, rng.uniform(0.001, 0.0035, send_times.size), 0.0
    )
    arrivals = send_times + delays
    # Joint2 path: accelerate 0.25 s, then cruise.
    path = np.where(
        send_times < 0.25, 5.0 * send_times**2, 0.3125 + 2.5 * (send_times - 0.25)
    )  # fmt: skip
    targets = [home + one_joint(p) for p in path]
    assert feed(ForwardStream(min_dt=0.001), arrivals, targets, home) > 2.45  # ran near the limit
    # The raw arrival intervals would have faked violations.
    raw = np.diff(arrivals)
    assert (np.abs(np.diff(path)) / raw).max() > 2.62 * 1.01


def test_forward_stream_queued_in_one_physics_step_does_not_trip():
    """A simulation that falls behind wall time steps physics in batches, and the commands
    that came meanwhile all arrive at the sim time the batch ended: at a stream's start (no
    typical interval yet) and while it runs (more of them bunched than not)."""
    home = np.array(FR3.home)
    step = 0.008  # rad per 4 ms: 2 rad/s
    batches = [0.0, 0.0, 0.0, 0.0, 0.0, 0.016, 0.016, 0.016, 0.016, 0.017]
    batches += [0.036 + 0.02 * (k // 5) for k in range(40)]  # 5 commands every 20 ms
    targets = [home + one_joint(step * (k + 1)) for k in range(len(batches))]
    worst = feed(ForwardStream(min_dt=0.001), batches, targets, home)
    assert 1.5 < worst < 2.2, worst
    # Judged one by one over the sim time between them, these steps would be 8 rad/s.


def test_forward_stream_bunch_is_judged_as_one_step_from_before_it():
    stream = ForwardStream(min_dt=0.001)
    q = np.array(FR3.home)
    for k in range(20):  # 250 Hz at rest
        stream.accepted(0.004 * k, q)
    # Physics paused (lock-step): commands at one sim time reach the arm as their last one,
    # a step from where the arm was, standing for one typical interval each (at most 20 ms).
    now, setpoint = 0.004 * 20, q
    for k in range(12):
        start, dt = stream.judge(now, setpoint)
        assert start is q and dt == pytest.approx(min(0.004 * (k + 1), 0.02)), k
        stream.accepted(now, setpoint)
        setpoint = q + one_joint(0.005 * (k + 1))
    # 12 steps of 5 mrad at once: 60 mrad in 20 ms is 3 rad/s.
    assert forward_step_violation(JOINTS, start, setpoint, dt, V_LIMIT) is not None
    # The next physics step starts a new bunch from the setpoint then.
    start, dt = stream.judge(now + 0.001, setpoint)
    assert start is setpoint and dt == pytest.approx(0.004)


def test_forward_stream_steps_are_judged_like_its_first_until_its_interval_is_known():
    stream = ForwardStream(min_dt=0.001)
    q = np.array(FR3.home)
    for k in range(4):
        assert stream.judge(1.0 + 0.004 * k, q) == (q, FIRST_STEP_DT_S), k
        stream.accepted(1.0 + 0.004 * k, q)
    assert stream.judge(1.016, q)[1] == pytest.approx(0.02)  # 3 intervals known
    stream.accepted(1.016, q)
    assert stream.judge(1.020, q)[1] == pytest.approx(0.004)
    # Every step of the start is judged over 20 ms, however bunched: a jump still trips.
    fresh = ForwardStream(min_dt=0.001)
    fresh.accepted(2.0, q)
    start, dt = fresh.judge(2.0, q + one_joint(0.01))
    assert start is q and dt == FIRST_STEP_DT_S
    assert forward_step_violation(JOINTS, start, q + one_joint(0.06), dt, V_LIMIT) is not None


def test_forward_stream_step_after_a_long_gap_trips():
    stream = ForwardStream(min_dt=0.001)
    q = np.array(FR3.home)
    for k in range(20):
        start, dt = stream.judge(0.004 * k, q)
        stream.accepted(0.004 * k, q)
    last = 0.004 * 19
    # 60 ms later (still the same stream): 0.1 rad at the actual interval would be 1.7 rad/s,
    # judged over min(5 x 4 ms, 20 ms) it is 5 rad/s.
    start, dt = stream.judge(last + 0.06, q)
    assert dt == pytest.approx(0.02)
    assert forward_step_violation(JOINTS, start, q + one_joint(0.1), dt, V_LIMIT) is not None
    # After more than 0.1 s the next command starts a new stream (judged over 20 ms too).
    assert stream.judge(last + 0.11, q) == (q, FIRST_STEP_DT_S)
    stream.reset()
    assert stream.judge(last + 0.05, q) == (q, FIRST_STEP_DT_S)


def test_trajectory_violation_judges_jumps_and_analytic_accelerations():
    start = np.array(FR3.home)
    times = 0.001 * np.arange(1, 51)
    # linear 0.13 rad in 50 ms on joint2: 2.6 rad/s, no acceleration -> fine
    sampler = TrajectorySampler(0.0, start, [0.05], [start + one_joint(0.13)])
    p, v, a = sampler.sample_many(np.concatenate(([0.0], times)))
    args = (V_LIMIT, A_LIMIT)
    assert trajectory_violation(JOINTS, times, p[1:], v, a, start, 0.0, *args) is None
    # a jump of the setpoint (e.g. a stamp in the past) is a velocity violation
    jumped = trajectory_violation(JOINTS, times, p[1:] + one_joint(0.01), v, a, start, 0.0, *args)
    assert jumped is not None and jumped.quantity == "velocity" and jumped.value > 10.0


def test_sample_many_matches_sample():
    start = np.array(FR3.home)
    sampler = TrajectorySampler(
        0.5,
        start,
        [0.0, 0.3, 0.8],
        [start, start + 0.1, start + 0.3],
        velocities=[np.zeros(7), np.full(7, 0.5), np.zeros(7)],
        accelerations=[np.zeros(7), np.zeros(7), np.zeros(7)],
    )
    times = np.linspace(0.0, 1.6, 321)
    p, v, a = sampler.sample_many(times)
    for k, t in enumerate(times):
        ps, vs, as_ = sampler.sample(t)
        np.testing.assert_allclose(p[k], ps, atol=1e-12)
        np.testing.assert_allclose(v[k], vs, atol=1e-12)
        np.testing.assert_allclose(a[k], as_, atol=1e-12)


# -- Simulator -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared_sim():
    return Simulator()


@pytest.fixture
def sim(shared_sim):
    shared_sim.reset()
    return shared_sim


def run_for(sim: Simulator, seconds: float) -> None:
    sim.step(round(seconds / sim.dt))


def arm(sim: Simulator) -> list[str]:
    return list(sim.arm_joint_names)


def test_trajectory_just_under_the_velocity_limit_runs(sim):
    goal = np.array(sim.robot.home) + one_joint(0.13)  # 2.6 rad/s over 50 ms
    assert sim.set_trajectory(arm(sim), [goal.tolist()], [0.05]) is None
    run_for(sim, 0.5)
    assert sim.fault is None
    assert np.abs(sim.arm_positions - goal).max() < 0.01


def test_trajectory_over_the_velocity_limit_trips_and_latches(sim):
    home = np.array(sim.robot.home)
    goal = home + one_joint(0.15)  # 3 rad/s over 50 ms: FR3's limit is 2.62
    reason = sim.set_trajectory(arm(sim), [goal.tolist()], [0.05])
    assert reason == "joint_velocity_violation: fr3_joint2 3.00 rad/s > 2.62 (limit)"
    assert sim.fault == reason and not sim.trajectory_active
    run_for(sim, 0.5)
    assert np.abs(sim.arm_positions - home).max() < 1e-3  # held where it was
    # Every command is refused, naming the fault, until recovery; the arm keeps holding.
    slow = (home + one_joint(0.05)).tolist()
    for refused in (
        sim.set_trajectory(arm(sim), [slow], [1.0]),
        sim.set_forward_positions(home.tolist()),
        sim.set_gripper(0.02),
        sim.set_gripper_command([0.02]),
        sim.set_gripper_command([]),  # malformed too: the latched fault is the reason given
    ):
        assert refused.startswith(reason) and "latched" in refused
    run_for(sim, 0.5)
    assert np.abs(sim.arm_positions - home).max() < 1e-3
    assert sim.gripper_width == pytest.approx(0.08, abs=1e-3)
    assert sim.recover() == reason and sim.fault is None
    assert sim.recover() is None
    assert sim.set_trajectory(arm(sim), [slow], [1.0]) is None
    run_for(sim, 1.5)
    assert np.abs(sim.arm_positions - np.array(slow)).max() < 0.01


def test_trip_during_a_motion_stops_the_arm_at_its_setpoint(sim):
    home = np.array(sim.robot.home)
    goal = home + 0.3
    assert sim.set_trajectory(arm(sim), [goal.tolist()], [2.0]) is None
    run_for(sim, 1.0)
    moving = sim.setpoint
    reason = sim.set_trajectory(arm(sim), [(moving - one_joint(0.2)).tolist()], [0.05])
    assert reason.startswith("joint_velocity_violation: fr3_joint2")
    np.testing.assert_allclose(sim.setpoint, moving, atol=1e-12)
    run_for(sim, 1.0)
    assert np.abs(sim.arm_positions - moving).max() < 0.01
    assert np.abs(sim.arm_positions - goal).max() > 0.1


def test_trajectory_acceleration_just_under_and_just_over_the_limit(sim):
    """A cubic Hermite from rest to rest (velocities 0 at the point): peak acceleration
    6 d / T^2 at both ends, peak velocity 1.5 d / T (far below the limit here)."""
    home = np.array(sim.robot.home)
    d = 0.1
    under_t = (6 * d / 9.95) ** 0.5  # 9.95 rad/s^2
    over_t = (6 * d / 10.15) ** 0.5  # 10.15 rad/s^2 > 10 x 1.01
    point = [(home + one_joint(d)).tolist()]
    assert sim.set_trajectory(arm(sim), point, [under_t], velocities=[[0.0] * 7]) is None
    run_for(sim, 0.5)
    assert sim.fault is None
    back = [home.tolist()]
    reason = sim.set_trajectory(arm(sim), back, [over_t], velocities=[[0.0] * 7])
    assert reason.startswith("joint_acceleration_violation: fr3_joint2 10.1")
    assert reason.endswith("rad/s^2 > 10.00 (limit)")
    assert sim.fault == reason


def test_trajectory_stamped_in_the_past_is_joined_from_now_until_its_first_point(sim):
    run_for(sim, 0.5)
    home = np.array(sim.robot.home)
    # Started 0.4 s ago, its point at 0.5 s: the setpoint goes from now, +0.1 rad in 0.1 s
    # (1 rad/s), never from the stamp (which would step it 0.08 rad at once).
    goal = home + one_joint(0.1)
    assert sim.set_trajectory(arm(sim), [goal.tolist()], [0.5], start_time=sim.time - 0.4) is None
    run_for(sim, 0.05)
    assert sim.setpoint[J2] == pytest.approx(home[J2] + 0.05, abs=2e-3)
    run_for(sim, 0.1)
    assert sim.fault is None and sim.setpoint[J2] == pytest.approx(goal[J2])
    # Back with 5 ms of it left: 0.1 rad in 5 ms (20 rad/s) trips the reflex.
    assert sim.set_trajectory(arm(sim), [home.tolist()], [0.5], start_time=sim.time - 0.495)
    assert sim.fault.startswith("joint_velocity_violation: fr3_joint2")


def test_trajectory_whose_first_point_has_passed_steps_onto_it_and_trips(sim):
    run_for(sim, 0.5)
    home = np.array(sim.robot.home)
    # Started 0.4 s ago: its segment from +0.1 rad (at 0.1 s) to +0.2 rad (at 0.5 s) is at
    # +0.175 rad now, where the controller's setpoint would jump at once.
    points = [(home + one_joint(0.1)).tolist(), (home + one_joint(0.2)).tolist()]
    reason = sim.set_trajectory(arm(sim), points, [0.1, 0.5], start_time=sim.time - 0.4)
    assert reason is not None and reason.startswith("joint_velocity_violation: fr3_joint2")


def test_forward_first_step_is_judged_over_20_ms(sim):
    home = np.array(sim.robot.home)
    assert FIRST_STEP_DT_S == 0.02
    assert sim.set_forward_positions((home + one_joint(0.0525)).tolist()) is None  # 2.625 rad/s
    run_for(sim, 0.2)  # > 0.1 s later: a new stream again
    reason = sim.set_forward_positions((home + one_joint(0.0525 + 0.054)).tolist())
    assert reason.startswith("joint_velocity_violation: fr3_joint2 2.70 rad/s")
    assert "20.0 ms" in reason


def test_forward_stream_within_limits_runs_and_a_jump_trips(sim):
    home = np.array(sim.robot.home)
    q = home.copy()
    for k in range(100):  # 250 Hz at 2.5 rad/s, two commands bunched into one physics step
        q = q + one_joint(0.01)
        assert sim.set_forward_positions(q.tolist()) is None, k
        if k % 5 != 2:
            sim.step(4 if k % 5 != 3 else 8)
    assert sim.fault is None
    run_for(sim, 0.04)  # 40 ms gap: a 0.05 rad step is judged over 20 ms (2.5 rad/s) and runs
    q = q + one_joint(0.05)
    assert sim.set_forward_positions(q.tolist()) is None
    sim.step(4)
    jump = q + one_joint(0.02)  # 20 mrad in 4 ms: 5 rad/s
    reason = sim.set_forward_positions(jump.tolist())
    assert reason.startswith("joint_velocity_violation: fr3_joint2 5.00 rad/s > 2.62 (limit)")
    np.testing.assert_allclose(sim.setpoint, q, atol=1e-12)
    run_for(sim, 0.5)
    assert np.abs(sim.arm_positions - q).max() < 0.01
    assert sim.set_forward_positions(q.tolist()).startswith(reason)
    sim.recover()
    assert sim.set_forward_positions(q.tolist()) is None


def test_reset_clears_the_fault(sim):
    home = np.array(sim.robot.home)
    assert sim.set_forward_positions((home + 0.2).tolist()) is not None
    assert sim.fault is not None
    sim.reset()
    assert sim.fault is None
    assert sim.set_forward_positions((home + one_joint(0.01)).tolist()) is None


def test_task_episode_reset_clears_the_fault():
    from vla_runtime.sim.tasks import TaskSimulator

    sim = TaskSimulator("reach", seed=1)
    home = np.array(sim.robot.home)
    assert sim.set_trajectory(arm(sim), [(home + 0.3).tolist()], [0.05]) is not None
    assert sim.fault is not None
    run_for(sim, 0.1)
    sim.randomize(2)
    assert sim.fault is None and sim.time == pytest.approx(0.1)
    assert sim.set_trajectory(arm(sim), [(home + 0.01).tolist()], [0.05]) is None


def test_ur5e_protective_stop():
    sim = Simulator(SceneConfig(robot="ur5e"))
    home = np.array(sim.robot.home)
    goal = home + one_joint(0.2, joint=2)[:6]  # 4 rad/s > pi
    reason = sim.set_trajectory(arm(sim), [goal.tolist()], [0.05])
    assert reason == "protective_stop: elbow_joint velocity 4.00 rad/s > 3.14 (limit)"
    assert sim.set_gripper(0.01).startswith("protective_stop")
    sim.recover()
    assert sim.set_trajectory(arm(sim), [goal.tolist()], [0.1]) is None  # 2 rad/s


@pytest.mark.parametrize("lookahead_periods, trips", [(3, True), (5, True), (6, False)])
def test_one_point_stream_through_a_stalled_command_intake(sim, lookahead_periods, trips):
    """The safety gate streams one-point trajectories, each reached `lookahead` periods after
    it is taken, at up to 90 % of the velocity limit. When the arm's command intake stalls
    (a loaded host: 5 periods here) for longer than the lookahead, the setpoint reaches the last
    target and holds; the commands queued meanwhile are then taken at once, and the last of
    them must close the whole gap within the lookahead: 6 periods of motion in 3 (twice the
    gate's speed) or in 5 (1.2 x) trip the reflex; a lookahead of 6 periods outlasts the stall
    and the stream keeps its speed."""
    period = 0.01
    gate = CommandGate(FR3, GateConfig(control_period_s=period))
    home = np.array(sim.robot.home)
    now = sim.time
    gate.update_state(sim.arm_positions, now)
    assert gate.command(home, None, now, now)
    target = home + one_joint(1.5)
    lookahead = lookahead_periods * period
    queued, reason, stall_speed = [], None, 0.0
    for tick in range(60):
        now = sim.time
        gate.update_state(sim.arm_positions, now)
        gate.command(target, None, now, now)
        queued.append(gate.tick(now).arm.tolist())
        if tick == 30:
            stall_speed = abs(gate.velocity[J2])
        if not 30 <= tick < 35:  # ticks 30-34: nothing reaches the arm
            for point in queued:  # taken back to back, as a starved subscriber takes them
                reason = reason or sim.set_trajectory(arm(sim), [point], [lookahead])
            queued = []
        run_for(sim, period)
    assert stall_speed > 0.85 * V_LIMIT[J2]  # cruising at the gate's limit when it stalls
    if trips:
        assert reason is not None and reason.startswith("joint_velocity_violation: fr3_joint2")
    else:
        assert reason is None
