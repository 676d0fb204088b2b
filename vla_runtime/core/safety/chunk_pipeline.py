"""From an arriving chunk to its verdict, pure logic without ROS: the newest chunk waits for one
check worker (a newer one supersedes it, a new episode discards it: both are stale), then the
episode test, the chunk check against the latest joint state and, once a scene is known, the
consequence rollout. Every chunk ends with exactly one verdict report."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.latest_slot import LatestSlot
from vla_runtime.core.safety.chunk_check import STALE, VETO, Chunk, ChunkChecker, Verdict
from vla_runtime.core.safety.rollout import rollout_verdict

SCENE_STATE_REPORT_S = 1.0  # s between reports of a broken scene state stream


@dataclass(frozen=True)
class PendingChunk:
    """A chunk as it arrived: `message` is the transport's, turned into a `Chunk` only when
    its check starts; `stamp` and `request` (the request it answers, "" for none) report it."""

    chunk_id: int
    message: object
    stamp: float
    request: str
    received: float  # time.perf_counter() at arrival


@dataclass(frozen=True)
class CheckedChunk:
    message: object  # as submitted
    verdict: Verdict
    report: dict  # the safety event to publish


def chunk_report(pending: PendingChunk, verdict: Verdict, check_ms: float) -> dict:
    """The safety event reporting the verdict on a chunk."""
    return {
        "event": "chunk",
        "chunk": pending.chunk_id,
        "stamp": pending.stamp,
        "request": pending.request,  # the streamer's request it answers, if any
        "check_ms": check_ms,
        **verdict.event(),
    }


class ChunkPipeline:
    """`submit` from the thread that receives chunks, `check_next` in a loop on the check
    worker's thread; `to_chunk(message)` converts a message there and `now()` is the time (s)
    chunk stamps compare with. The joint state, the scene and the episode are read by the
    worker as they are when a check starts."""

    def __init__(
        self,
        checker: ChunkChecker,
        to_chunk: Callable[[object], Chunk],
        now: Callable[[], float],
    ):
        self.checker = checker
        self.arm_joints = list(checker.robot.joints)
        self.gripper_joint = checker.gripper_joint
        self._to_chunk, self._now = to_chunk, now
        # The rollout of the scene: `consequence.rollout(...)` (core/safety/rollout.py) and
        # `consequence.model.nq`, the length of a scene state; None: no rollout.
        self.consequence = None
        self.scene_qpos: np.ndarray | None = None
        self.scene_states_rejected = 0
        self._scene_state_reported = -math.inf
        self._state: tuple[np.ndarray, np.ndarray, float] | None = None  # q, dq, stamp
        self._episode_start = -math.inf
        self._received = 0
        self._chunks = LatestSlot()  # the PendingChunk waiting for the worker

    # -- inputs ------------------------------------------------------------------------------
    def joint_state(self, positions, velocities, stamp: float) -> bool:
        """A measured arm state (velocities None: unknown, taken as rest). False when it was
        measured before the episode started: not the arm of now."""
        q = np.array(positions, dtype=float)
        dq = np.zeros(len(q)) if velocities is None else np.array(velocities, dtype=float)
        if stamp < self._episode_start:
            return False
        if np.isfinite(q).all() and np.isfinite(dq).all():
            self._state = (q, dq, stamp)
        return True

    def scene_state(self, qpos, wall: float) -> dict | None:
        """A scene state (the simulator's qpos) at `wall` (monotonic s); one that does not fit
        the scene is dropped, and reported (the event returned) at most once a second."""
        qpos = np.asarray(qpos, dtype=float)
        consequence = self.consequence
        if consequence is not None and qpos.shape != (consequence.model.nq,):
            self.scene_states_rejected += 1
            if wall - self._scene_state_reported >= SCENE_STATE_REPORT_S:
                self._scene_state_reported = wall
                return {"event": "scene_state_rejected", "values": int(qpos.size),
                        "count": self.scene_states_rejected}  # fmt: skip
            return None
        self.scene_qpos = qpos
        return None

    def new_episode(self, start: float) -> list[dict]:
        """The scene was reset at `start`: the waiting chunk and the joint state belong to the
        previous episode. Returns the reports to publish."""
        superseded = self._chunks.clear()
        self._episode_start = start
        self._state = None
        return self._stale(superseded, "from the previous episode")

    def submit(self, message, stamp: float, request: str) -> list[dict]:
        """A chunk arrived; returns the reports to publish (of the one it superseded)."""
        self._received += 1
        pending = PendingChunk(self._received, message, stamp, request, time.perf_counter())
        superseded = self._chunks.put(pending)
        return self._stale(superseded, "superseded by a newer chunk before its check")

    # -- the check worker --------------------------------------------------------------------
    def check_next(self) -> CheckedChunk | None:
        """Wait for the next chunk and judge it; None once closed."""
        pending = self._chunks.take()
        if pending is None:
            return None
        try:
            verdict = self.judge(self._to_chunk(pending.message))
        except Exception as exc:  # every chunk ends with a verdict, even a crashing one
            verdict = Verdict(VETO, (f"check failed: {exc!r}",))
        check_ms = 1e3 * (time.perf_counter() - pending.received)
        return CheckedChunk(pending.message, verdict, chunk_report(pending, verdict, check_ms))

    def judge(self, chunk: Chunk) -> Verdict:
        """The verdict on `chunk` now: stale from before the episode, else the chunk check and,
        for an executable chunk with a scene to roll out in, the consequence rollout."""
        now = self._now()
        if chunk.stamp < self._episode_start:
            return Verdict(STALE, ("observed before the episode started",))
        state = self._state
        q, dq, stamp = state if state is not None else (None, None, None)
        verdict = self.checker.check(chunk, now, q, stamp)
        consequence, scene_qpos = self.consequence, self.scene_qpos
        if verdict.executable and consequence is not None and scene_qpos is not None:
            verdict = rollout_verdict(verdict, chunk, now, dq, consequence, scene_qpos,
                                      self.arm_joints, self.gripper_joint,
                                      self.checker.config.min_points)  # fmt: skip
        return verdict

    def close(self) -> None:
        """Wake the worker for good: `check_next` returns None from now on."""
        self._chunks.close()

    @staticmethod
    def _stale(pending: PendingChunk | None, reason: str) -> list[dict]:
        if pending is None:
            return []
        return [chunk_report(pending, Verdict(STALE, (reason,)), 0.0)]
