"""Recovery data (DAgger-style, no teleoperator): where a policy goes, the expert shows the way.

A checkpoint runs closed loop in the in-process simulator. Every `branch_every` control steps
the whole simulator state is saved, a fresh scripted expert takes over from exactly that state
(at the waypoint that state calls for: `ScriptedExpert.resume_phase`) for `branch_steps` steps
(recorded, rendered, success-labelled: an ordinary episode), and the state is restored so the
policy carries on where it was. The branches cover the states the policy really visits,
including the drifted ones an expert alone never shows, each with the expert's way back (Ross
et al., DAgger, 2011). Training on expert data + branches is
`vla-runtime train --data expert --data branches --include-failed` (a short branch rarely ends
in success, and training skips failed episodes otherwise).

A policy can teach in the expert's place (`teacher`): the branches then show what a stronger
checkpoint does from the states the rolled-out one visits, which distils a behaviour the
scripted expert's demonstrations did not carry over (DAgger with a learned expert).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import mujoco
import numpy as np
from tqdm import tqdm

from vla_runtime.data.expert_recording import (
    ExpertRecorder,
    sigint_deferred,
    task_dataset_writer,
)
from vla_runtime.data.lerobot.writer import Episode
from vla_runtime.engine.earlier_frames import FrameHistory
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import Observation, chunk_to_positions
from vla_runtime.sim.env import CommandRefused, InProcessEnv, clip_to_limits
from vla_runtime.sim.tasks import SceneReader, is_success, scene_colours

_SHARED = ("model", "data", "xml", "reader", "robot", "config")  # never change during an episode


class SimCheckpoint:
    """A restorable copy of a `TaskSimulator`'s complete state (physics + controller)."""

    def __init__(self, sim):
        self.data = mujoco.MjData(sim.model)
        mujoco.mj_copyData(self.data, sim.model, sim.data)
        self.attributes = {k: copy.deepcopy(v) for k, v in vars(sim).items() if k not in _SHARED}

    def restore(self, sim) -> None:
        mujoco.mj_copyData(sim.data, sim.model, self.data)
        for key, value in self.attributes.items():
            setattr(sim, key, copy.deepcopy(value))


class PolicyActor:
    """A checkpoint acting one control step at a time: it plans from the frame it is in and runs
    the first `execute` actions of each chunk (the rolled-out policy, or a teacher)."""

    def __init__(self, policy, robot, execute: int):
        self.policy, self.robot, self.execute = policy, robot, execute
        self._rows: list[np.ndarray] = []
        self._history = FrameHistory(policy.spec)

    def restart(self) -> None:
        self._rows = []
        self._history = FrameHistory(self.policy.spec)

    @property
    def between_chunks(self) -> bool:
        return not self._rows

    def act(self, frame, setup) -> tuple[np.ndarray, float]:
        images = self._history.complete(frame.images, frame.time)
        if not self._rows:
            obs = Observation(images, frame.state, setup.instruction, frame.time)
            chunk = self.policy.infer(obs).actions[: self.execute]
            rows = chunk_to_positions(chunk, frame.state, self.policy.spec)
            self._rows = list(clip_to_limits(rows, self.robot))
        row = self._rows.pop(0)
        return row[:-1], float(row[-1])


def expert_branch(env: InProcessEnv, frame, reader: SceneReader, steps: int,
                  teacher: PolicyActor | None = None) -> Episode | None:  # fmt: skip
    """A fresh expert (or `teacher`) from the current state for `steps` control steps,
    recorded. A command the arm refuses (a fresh expert snapping a tilted wrist upright can
    exceed a velocity limit) ends the branch before it; None when nothing before it was
    recorded."""
    if teacher is not None:
        teacher.restart()
    recorder = ExpertRecorder(env, reader, teacher)
    for _ in range(steps):
        try:
            frame, _solved = recorder.step(frame)
        except CommandRefused:
            recorder.forget_last()
            break
    if not recorder.actions:
        return None
    extra = {"task": env.setup.task, "recovery_branch": True}
    return recorder.episode(bool(any(recorder.flags)), extra)


def collect_recovery(
    checkpoint: str, task: str, episodes: int, out: str | Path, seed: int = 0,
    branch_every: int = 8, branch_steps: int = 24, execute: int = 2, progress: bool = True,
    servo_feedforward: bool = False, teacher: str | None = None,
) -> dict:  # fmt: skip
    """Roll `checkpoint` on `task` (seeds seed, seed+1, ...), branching the expert (or the
    `teacher` checkpoint) off it; `servo_feedforward`: on the simulated servo that tracks its
    setpoint's velocity."""

    if seed + episodes > 90000:
        raise ValueError("seeds >= 90000 are reserved for evaluation")
    policy = load_policy("torch", checkpoint, seed=0)
    size = policy.spec.cameras[0].height
    robot = policy.spec.robot or "fr3"
    teacher_policy = None if teacher is None else load_policy("torch", teacher, seed=0)
    if teacher_policy is not None and (
        teacher_policy.spec.sensors != policy.spec.sensors
        or (teacher_policy.spec.robot or "fr3") != robot
    ):
        raise ValueError(f"teacher {teacher} sees other cameras or drives another arm than "
                         f"{checkpoint}")  # fmt: skip
    writer = task_dataset_writer(out, size, robot)
    env = InProcessEnv(task, size, robot=robot, servo_feedforward=servo_feedforward)
    student = PolicyActor(policy, env.sim.robot, execute)
    taught_by = None if teacher_policy is None else PolicyActor(
        teacher_policy, env.sim.robot, execute)  # fmt: skip
    reader = SceneReader(env.model, scene_colours())
    branches = branch_successes = policy_successes = done = cut_branches = 0
    refused_rollouts = 0
    interrupted = False
    started = time.perf_counter()
    try:
        for k in tqdm(range(episodes), desc=f"recovery {task}", disable=not progress):
            frame = env.reset(seed + k)
            setup = env.setup
            student.restart()
            steps, succeeded = 0, False
            # A chunk begun before the step limit runs to its end.
            while not succeeded and (steps < setup.max_steps or not student.between_chunks):
                if student.between_chunks and steps % branch_every == 0:
                    saved = SimCheckpoint(env.sim)
                    branch = expert_branch(env, frame, reader, branch_steps, taught_by)
                    with sigint_deferred() as deferred:  # a finished branch is kept and counted
                        if branch is None or len(branch.action) < branch_steps:
                            cut_branches += 1
                        if branch is not None:
                            writer.add_episode(branch)
                            branches += 1
                            branch_successes += branch.success
                    if deferred.hit:
                        raise KeyboardInterrupt
                    saved.restore(env.sim)
                try:
                    frame = env.step(*student.act(frame, setup))
                except CommandRefused:  # the arm's reflex ends this rollout
                    refused_rollouts += 1
                    break
                steps += 1
                succeeded = is_success(setup, reader.snapshot(frame.qpos))
            policy_successes += succeeded
            done += 1
    except KeyboardInterrupt:
        interrupted = True
    finally:
        env.close()
    return {
        "task": task, "episodes": done, "interrupted": interrupted, "branches": branches,
        "branches_cut_by_a_refusal": cut_branches, "rollouts_ended_by_a_refusal": refused_rollouts,
        "branch_success_rate": branch_successes / max(branches, 1),
        "policy_success_rate": policy_successes / max(done, 1),
        "seconds": round(time.perf_counter() - started, 1), "out": str(out),
        "checkpoint": checkpoint, "seed": seed, "branch_every": branch_every,
        "branch_steps": branch_steps, "execute": execute, "servo_feedforward": servo_feedforward,
        "teacher": teacher,
    }  # fmt: skip
