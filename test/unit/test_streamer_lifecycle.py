"""When the streamer starts, holds, resyncs and restarts (core/streaming/lifecycle.py)."""

import math

import numpy as np
import pytest

from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.chunk_check import Chunk
from vla_runtime.core.safety.gate import CommandGate, GateConfig
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.lifecycle import INFO, REPEATED, WARNING, Notice, StreamerLifecycle
from vla_runtime.core.streaming.metrics import LoopTiming
from vla_runtime.core.streaming.streamer import ActionStreamer

ROBOT = load_robot("fr3")
ARM = list(ROBOT.joints)
HOME = list(ROBOT.home)
GRIPPER = ROBOT.gripper_joints[0]
REST = [0.0] * len(ARM)
OPEN = 0.04
PERIOD = 0.004


def lifecycle(**kwargs) -> StreamerLifecycle:
    config = StreamerConfig(control_period_s=PERIOD, warmup_requests=0)
    return StreamerLifecycle(config, ROBOT, OPEN, 0.03, **kwargs)


def started(stamp=1.0, gripper=0.02, **kwargs) -> StreamerLifecycle:
    stream = lifecycle(**kwargs)
    assert stream.joint_state(stamp, HOME, REST, gripper).level == INFO
    return stream


def arm_chunk(stamp: float, offset: float = 0.0, names=ARM) -> Chunk:
    times = tuple(0.02 * (k + 1) for k in range(10))
    row = tuple(q + offset for q in HOME)
    return Chunk(tuple(names), stamp, times, (row,) * len(times))


def test_nothing_streams_before_a_complete_finite_joint_state():
    stream = lifecycle()
    assert stream.tick(1.0) is None and stream.figures() is None
    assert stream.chunk(1.0, arm_chunk(0.9), None) == Notice(
        REPEATED, "chunk before the first joint state: ignored"
    )
    lacking = stream.joint_state(1.0, None, None, OPEN)
    assert lacking == Notice(REPEATED, f"joint state lacks arm joints {ARM}; not starting yet")
    nan = [math.nan, *HOME[1:]]
    assert stream.joint_state(1.0, nan, REST, OPEN).text.startswith("non-finite joint state [nan")
    assert stream.joint_state(1.0, HOME, REST, math.inf).level == REPEATED
    assert not stream.started


def test_the_first_state_is_held_with_the_gripper_it_measured_or_open():
    stream = started(gripper=0.02)
    setpoint, request = stream.tick(1.0)
    np.testing.assert_array_equal(setpoint.position, [*HOME, 0.02])
    assert setpoint.holding and setpoint.time == 1.0
    assert request is not None and request.request_id == 1  # an empty plan asks at once
    without_gripper = started(gripper=None)
    np.testing.assert_array_equal(without_gripper.tick(1.0)[0].position, [*HOME, OPEN])
    notice = lifecycle().joint_state(1.0, HOME, None, 0.02)  # velocities unknown: still starts
    assert notice.text == f"holding the measured state {np.round([*HOME, 0.02], 4).tolist()}"


def test_speed_scaling_gates_the_start_and_is_applied_from_the_first_reading():
    stream = lifecycle(speed_scaling_topic="/speed")
    waiting = stream.joint_state(1.0, HOME, REST, OPEN)
    assert waiting == Notice(
        REPEATED,
        "no speed scaling on /speed yet; not starting (set speed_scaling_topic:='' to stream "
        "without it)",
    )
    assert stream.speed_scaling(50.0, 7.0) == (None, "speed scaling 50%")
    assert stream.speed_scaling(math.nan, 7.5)[1] is None and stream.speed.rejected == 1
    assert stream.joint_state(1.0, HOME, REST, OPEN).level == INFO
    assert stream.figures()["speed_scaling"] == 0.5
    assert stream.speed_scaling(0.0, 8.0) == (None, "speed scaling 0: plan paused")
    assert stream.figures()["speed_scaling"] == 0.0


def test_a_held_command_resyncs_to_an_arm_at_rest_beyond_the_tolerance():
    stream = started()
    stream.tick(1.0)
    near = [HOME[0] + 0.02, *HOME[1:]]
    assert stream.joint_state(1.1, near, REST, None) is None  # within 0.03 rad
    away = [HOME[0] + 0.05, *HOME[1:]]
    moving = [0.1, *REST[1:]]
    assert stream.joint_state(1.1, away, moving, None) is None  # the arm still moves
    assert stream.joint_state(1.1, away, None, None) is None  # its motion is unknown
    assert stream.joint_state(1.1, away, [math.nan, *REST[1:]], None) is None
    assert stream.joint_state(1.1, None, None, None) is None  # lacking joints: ignored
    assert stream.figures()["resyncs"] == 0
    notice = stream.joint_state(1.1, away, REST, None)
    assert notice == Notice(WARNING, "held command moved to the measured arm")
    assert stream.figures()["resyncs"] == 1
    np.testing.assert_allclose(stream.tick(1.104)[0].position, [*away, 0.02])


def test_chunks_merge_in_joint_order_or_are_rejected_with_the_reason():
    stream = started()
    stream.tick(1.0)
    assert stream.chunk(1.0, arm_chunk(1.0), 1) is None  # arm only: the gripper keeps 0.02
    figures = stream.figures()
    assert figures["chunks_accepted"] == 1 and figures["delay_samples"] == 1
    assert stream.tick(1.1)[0].position[-1] == 0.02
    bad = stream.chunk(1.1, arm_chunk(1.1, names=[*ARM[:-1], "elbow"]), None)
    assert bad == Notice(
        REPEATED, f"chunk rejected: joint names {[*ARM[:-1], 'elbow']}: missing "
        f"{[ARM[-1]]}, unknown ['elbow']"
    )  # fmt: skip
    late = stream.chunk(1.1, arm_chunk(0.5), None)
    assert late.level == REPEATED and late.text.startswith("chunk rejected: all 10 actions stale")
    assert stream.figures()["chunks_rejected"] == 2


def test_a_chunk_refused_unread_is_counted_with_its_reason():
    reason = "JointTrajectory of 9000000 bytes refused unread (at most 1048576)"
    assert lifecycle().chunk_refused(reason).level == REPEATED  # before the first state too
    stream = started()
    assert stream.chunk_refused(reason) == Notice(REPEATED, f"chunk rejected: {reason}")
    figures = stream.figures()
    assert (figures["chunks_rejected"], figures["last_rejection"]) == (1, reason)


def test_a_new_episode_restarts_from_the_first_state_measured_after_it():
    stream = started(stamp=1.0)
    assert stream.new_episode(5.0) == Notice(INFO, "episode 1 from t=5.000: restarting")
    assert not stream.started and stream.tick(5.0) is None and stream.episode == 1
    assert stream.joint_state(4.9, HOME, REST, OPEN) is None  # measured before the reset
    assert not stream.started
    assert stream.joint_state(5.1, HOME, REST, OPEN).level == INFO
    stream.tick(5.1)
    assert stream.chunk(5.1, arm_chunk(4.95), None) == Notice(
        REPEATED, "chunk rejected: observed before the episode started"
    )
    figures = stream.figures()
    assert figures["chunks_rejected"] == 1
    assert figures["last_rejection"] == "observed before the episode started"


def test_a_refused_request_lets_the_next_one_go_at_once():
    stream = started()
    assert stream.tick(1.0)[1].request_id == 1
    assert stream.tick(1.004)[1] is None  # awaiting the answer
    stream.request_refused(2)  # not the pending one
    assert stream.tick(1.008)[1] is None
    stream.request_refused(1)
    retry = stream.tick(1.012)[1]
    assert (retry.request_id, retry.retry) == (2, 1)  # the engine should sample afresh
    assert stream.figures()["requests_refused"] == 1
    lifecycle().request_refused(1)  # before the start: nothing to refuse


def test_stats_carry_the_episode_speed_source_and_loop_figures():
    stream = lifecycle(speed_scaling_topic="/speed")
    stream.speed_scaling(80.0, 10.0)
    stream.new_episode(0.0)
    stats = stream.stats(
        LoopTiming(PERIOD), 12.5, control_rate_hz=250.0, tick_source="thread", overruns=3
    )
    assert stats["started"] is False and stats["episode"] == 1
    assert stats["speed_scaling_topic"] == "/speed"
    assert stats["speed_scaling_age_s"] == pytest.approx(2.5)
    assert (stats["mode"], stats["request_policy"]) == ("async", "threshold")
    assert (stats["control_rate_hz"], stats["tick_source"], stats["overruns"]) == (
        250.0,
        "thread",
        3,
    )
    stream.joint_state(1.0, HOME, REST, OPEN)
    assert stream.stats(LoopTiming(PERIOD), 13.0, control_rate_hz=250.0, tick_source="thread",
                        overruns=0)["started"]  # fmt: skip


@pytest.mark.parametrize("robot_name", ["fr3", "ur5e"])
def test_a_halted_plan_brakes_within_the_gates_limits_so_its_output_never_turns_back(robot_name):
    """The gate follows the streamer's brake exactly: braking harder than the gate may, the
    command would run ahead of the gate's output, which overshoots and comes back (a UR5e
    moving 0.4 rad/s came back 1.2 mrad at 0.07 rad/s, and the arm with it)."""
    robot = load_robot(robot_name)
    n, period = robot.dof, 0.01
    config = StreamerConfig(control_period_s=period, warmup_requests=0)
    limits = StreamerLifecycle(config, robot, OPEN, 0.03).limits
    home = np.array([*robot.home, OPEN])
    streamer = ActionStreamer(config, limits, home, arm_dof=n)
    times = 0.05 * (np.arange(40) + 1)
    streamer.merge_chunk(0.0, 0.0, times, home + np.outer(0.4 * times, np.eye(n + 1)[0]))
    gate = CommandGate(robot, GateConfig(control_period_s=period))
    commands, outputs = [], []
    for k in range(100):
        now = k * period
        if k == 50:
            streamer.halt(now, "chunk_overdue")
        setpoint = streamer.tick(now)
        commands.append(setpoint.position[0])
        gate.update_state(outputs[-1] if outputs else np.array(robot.home), now)
        gate.command(setpoint.position[:n], None, setpoint.time, now)
        out = gate.tick(now)
        outputs.append(out.arm if out.arm is not None else outputs[-1])
    joint = np.array([q[0] for q in outputs])
    assert joint[60] - joint[40] > 0.04  # it was moving, then braked
    assert np.diff(joint).min() > -1e-5  # never back (but for rounding)
    assert abs(joint[-1] - commands[-1]) < 1e-5  # at rest where the command stopped
