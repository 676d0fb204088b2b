"""From an arriving chunk to its one verdict report (core/safety/chunk_pipeline.py): superseded
and previous-episode chunks, the joint state the check uses, the rollout hand-off."""

from types import SimpleNamespace

import numpy as np
import pytest

from vla_runtime.core.kinematics import FRANKA
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.chunk_check import (
    ACCEPT,
    STALE,
    VETO,
    Chunk,
    ChunkCheckConfig,
    ChunkChecker,
)
from vla_runtime.core.safety.chunk_pipeline import ChunkPipeline, PendingChunk, chunk_report

ROBOT = load_robot("fr3")
HOME = list(ROBOT.home)
STAMP, NOW, STATE_STAMP = 10.0, 10.05, 10.04


def still_chunk(stamp=STAMP) -> Chunk:
    times = tuple(0.1 * (k + 1) for k in range(5))
    return Chunk(tuple(ROBOT.joints), stamp, times, (tuple(HOME),) * len(times))


def pipeline(to_chunk=lambda message: message, now=NOW) -> ChunkPipeline:
    checker = ChunkChecker(ROBOT, FRANKA, ChunkCheckConfig())
    return ChunkPipeline(checker, to_chunk, lambda: now)


def submit(chunks: ChunkPipeline, chunk: Chunk, request: str = "req:4") -> list[dict]:
    return chunks.submit(chunk, chunk.stamp, request)


class FakeConsequence:
    """A scene of 3 qpos values whose rollouts find `hazards`."""

    model = SimpleNamespace(nq=3)

    def __init__(self):
        self.hazards, self.calls = [], []

    def rollout(self, qpos, arm_velocity, times, arm_positions, gripper_widths=None):
        self.calls.append((qpos, arm_velocity))
        numbers = {"max_contact_n": 2.0}
        return SimpleNamespace(safe=not self.hazards, hazards=self.hazards, numbers=numbers,
                               first_hazard_s=None)  # fmt: skip


def test_a_checked_chunk_is_reported_once_with_its_request_and_passed_on():
    chunks = pipeline()
    assert chunks.joint_state(HOME, None, STATE_STAMP)
    chunk = still_chunk()
    assert submit(chunks, chunk) == []
    checked = chunks.check_next()
    assert checked.message is chunk and checked.verdict.decision == ACCEPT
    report = checked.report
    assert {k: report[k] for k in ("event", "chunk", "stamp", "request", "verdict")} == {
        "event": "chunk", "chunk": 1, "stamp": STAMP, "request": "req:4", "verdict": ACCEPT,
    }  # fmt: skip
    assert report["check_ms"] >= 0.0 and report["observation_age_s"] == pytest.approx(0.05)
    assert report["reasons"] == [] and report["state_age_s"] == pytest.approx(0.01)


def test_a_chunk_superseded_before_its_check_is_reported_stale():
    chunks = pipeline()
    chunks.joint_state(HOME, None, STATE_STAMP)
    assert submit(chunks, still_chunk()) == []
    stale = submit(chunks, still_chunk(10.01), request="")
    assert stale == [{"event": "chunk", "chunk": 1, "stamp": STAMP, "request": "req:4",
                      "check_ms": 0.0, "verdict": STALE,
                      "reasons": ["superseded by a newer chunk before its check"]}]  # fmt: skip
    checked = chunks.check_next()
    assert checked.report["chunk"] == 2 and checked.report["request"] == ""


def test_a_new_episode_discards_the_waiting_chunk_the_state_and_older_chunks():
    chunks = pipeline()
    chunks.joint_state(HOME, None, STATE_STAMP)
    submit(chunks, still_chunk())
    (stale,) = chunks.new_episode(10.02)
    assert stale["chunk"] == 1 and stale["verdict"] == STALE
    assert stale["reasons"] == ["from the previous episode"]
    assert chunks.new_episode(10.02) == []  # nothing waiting
    assert chunks.judge(still_chunk(10.03)).reasons == ("joint state unknown",)
    assert not chunks.joint_state(HOME, None, 10.01)  # measured before the reset
    assert chunks.judge(still_chunk(10.03)).reasons == ("joint state unknown",)
    assert chunks.joint_state(HOME, None, STATE_STAMP)
    old = chunks.judge(still_chunk(10.0))
    assert old.decision == STALE and old.reasons == ("observed before the episode started",)
    assert chunks.judge(still_chunk(10.03)).decision == ACCEPT


def test_a_non_finite_state_is_not_used():
    chunks = pipeline()
    assert chunks.joint_state(HOME, [np.nan] * len(HOME), STATE_STAMP)  # this episode's
    verdict = chunks.judge(still_chunk())
    assert verdict.decision == VETO and verdict.reasons == ("joint state unknown",)


def test_a_check_that_fails_is_a_veto():
    def broken(message):
        raise ValueError("bad message")

    chunks = pipeline(to_chunk=broken)
    submit(chunks, still_chunk())
    checked = chunks.check_next()
    assert checked.verdict.decision == VETO
    assert checked.report["reasons"] == ["check failed: ValueError('bad message')"]


def test_scene_states_of_the_wrong_size_are_dropped_and_reported_once_a_second():
    chunks = pipeline()
    assert chunks.scene_state([1.0, 2.0], 0.0) is None  # no scene yet: any size is kept
    chunks.consequence = FakeConsequence()
    assert chunks.scene_state([1.0, 2.0], 5.0) == {
        "event": "scene_state_rejected", "values": 2, "count": 1,
    }  # fmt: skip
    assert chunks.scene_state([1.0], 5.5) is None
    assert chunks.scene_state([1.0], 6.0)["count"] == 3
    np.testing.assert_array_equal(chunks.scene_qpos, [1.0, 2.0])
    assert chunks.scene_state([1.0, 2.0, 3.0], 6.1) is None
    np.testing.assert_array_equal(chunks.scene_qpos, [1.0, 2.0, 3.0])


def test_an_executable_chunk_is_rolled_out_with_the_measured_velocity():
    chunks = pipeline()
    velocity = [0.01] * len(HOME)
    chunks.joint_state(HOME, velocity, STATE_STAMP)
    consequence = FakeConsequence()
    chunks.consequence = consequence
    assert chunks.judge(still_chunk()).decision == ACCEPT and consequence.calls == []  # no scene
    chunks.scene_state([0.0, 0.0, 0.0], 0.0)
    verdict = chunks.judge(still_chunk())
    qpos, dq = consequence.calls[0]
    np.testing.assert_array_equal(qpos, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(dq, velocity)
    assert verdict.decision == ACCEPT and verdict.numbers["rollout_max_contact_n"] == 2.0
    consequence.hazards = ["cube pushed off the table"]
    vetoed = chunks.judge(still_chunk())
    assert vetoed.decision == VETO
    assert vetoed.reasons == ("consequence: cube pushed off the table",)
    chunks.joint_state(HOME, None, STATE_STAMP)  # no velocities: at rest
    chunks.judge(still_chunk())
    np.testing.assert_array_equal(consequence.calls[-1][1], np.zeros(len(HOME)))


def test_closing_ends_the_worker_loop():
    chunks = pipeline()
    chunks.close()
    assert chunks.check_next() is None


def test_the_report_carries_the_verdict_numbers():
    pending = PendingChunk(7, None, 3.25, "req:2", 0.0)
    verdict = pipeline().judge(still_chunk())  # joint state unknown: a veto
    report = chunk_report(pending, verdict, 1.5)
    assert report == {"event": "chunk", "chunk": 7, "stamp": 3.25, "request": "req:2",
                      "check_ms": 1.5, **verdict.event()}  # fmt: skip
    assert report["verdict"] == VETO and report["observation_age_s"] == pytest.approx(0.05)
