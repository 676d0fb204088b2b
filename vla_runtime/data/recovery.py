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

The rollout can also be a product-path episode replayed (`collect_replay_recovery`): the arm
follows the path it took through the stack in real time, so the branches start from the states
the policy reaches there, which its lock-step rollouts need not visit.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np
from tqdm import tqdm

from vla_runtime.core.delayed_chunks import DelayedChunks
from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD
from vla_runtime.data.expert_recording import (
    ExpertRecorder,
    sigint_deferred,
    task_dataset_writer,
)
from vla_runtime.data.lerobot.writer import Episode
from vla_runtime.data.rollout_trajectories import RolloutTrajectory, load_trajectories
from vla_runtime.engine.earlier_frames import FrameHistory
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import Observation, chunk_to_positions
from vla_runtime.sim.env import CommandRefused, InProcessEnv, clip_to_limits
from vla_runtime.sim.tasks import CONTROL_DT, SceneReader, is_success, scene_colours

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
    `execute` actions of each chunk, `delay` control steps late as through the stack
    (core/delayed_chunks.py; the rolled-out policy, or a teacher)."""

    def __init__(self, policy, robot, execute: int, delay: int = 0):
        self.policy, self.robot = policy, robot
        self._schedule = DelayedChunks(execute, delay)
        self._rows: list[np.ndarray] = []
        self._history = FrameHistory(policy.spec)

    def restart(self) -> None:
        self._rows = []
        self._history = FrameHistory(self.policy.spec)
        self._schedule.restart()

    @property
    def between_chunks(self) -> bool:
        return not self._rows

    def finished(self, frame) -> bool:
        return False

    def act(self, frame, setup) -> tuple[np.ndarray, float]:
        images = self._history.complete(frame.images, frame.time)
        if not self._rows:
            obs = Observation(images, frame.state, setup.instruction, frame.time)
            rows = chunk_to_positions(self.policy.infer(obs).actions, frame.state,
                                      self.policy.spec)  # fmt: skip
            self._rows = self._schedule.rows_to_run(clip_to_limits(rows, self.robot), frame.state)
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


REPLAY_GRACE_S = 0.25


class ReplayActor:
    """Drives the arm along a product-path episode's recorded path (data/rollout_trajectories.py):
    each step toward where the measured arm was one control step later, the gripper as it was
    commanded. Branches can start at any step."""

    between_chunks = True

    def __init__(self, trajectory: RolloutTrajectory, robot):
        self.trajectory, self.robot = trajectory, robot
        self._start: float | None = None

    def restart(self) -> None:
        self._start = None

    def _elapsed(self, frame) -> float:
        """Sim s since the episode began (the reset settles one control period, as the stack's)."""
        if self._start is None:
            self._start = frame.time - CONTROL_DT
        return frame.time - self._start

    def finished(self, frame) -> bool:
        # The recording ends at the moment the stack saw success; the replayed arm, a servo lag
        # behind it, gets a moment more to get there.
        return self._elapsed(frame) >= self.trajectory.duration + REPLAY_GRACE_S

    def act(self, frame, setup) -> tuple[np.ndarray, float]:
        q, width = self.trajectory.target(self._elapsed(frame) + CONTROL_DT)
        row = clip_to_limits([[*q, frame.state[-1] if width is None else width]], self.robot)[0]
        return row[:-1], float(row[-1])


@dataclass
class _Tally:
    branches: int = 0
    branch_successes: int = 0
    cut_branches: int = 0
    refused_rollouts: int = 0
    successes: int = 0
    done: int = 0

    def summary(self) -> dict:
        return {
            "episodes": self.done, "branches": self.branches,
            "branches_cut_by_a_refusal": self.cut_branches,
            "rollouts_ended_by_a_refusal": self.refused_rollouts,
            "branch_success_rate": self.branch_successes / max(self.branches, 1),
        }  # fmt: skip


def _roll_and_branch(
    env: InProcessEnv, reader: SceneReader, writer, actor, seed: int, branch_every: int,
    branch_steps: int, teacher, tally: _Tally,
) -> bool:  # fmt: skip
    """One rollout of `actor` from `seed`'s scene with a recorded expert (or `teacher`) branch
    every `branch_every` steps; whether the rollout solved the task."""
    frame = env.reset(seed)
    setup = env.setup
    actor.restart()
    steps, succeeded = 0, False
    # A chunk begun before the step limit runs to its end.
    while not succeeded and (steps < setup.max_steps or not actor.between_chunks):
        if actor.finished(frame):
            break
        if actor.between_chunks and steps % branch_every == 0:
            saved = SimCheckpoint(env.sim)
            branch = expert_branch(env, frame, reader, branch_steps, teacher)
            with sigint_deferred() as deferred:  # a finished branch is kept and counted
                if branch is None or len(branch.action) < branch_steps:
                    tally.cut_branches += 1
                if branch is not None:
                    writer.add_episode(branch)
                    tally.branches += 1
                    tally.branch_successes += branch.success
            if deferred.hit:
                raise KeyboardInterrupt
            saved.restore(env.sim)
        try:
            frame = env.step(*actor.act(frame, setup))
        except CommandRefused:  # the arm's reflex ends this rollout
            tally.refused_rollouts += 1
            break
        steps += 1
        succeeded = is_success(setup, reader.snapshot(frame.qpos))
    tally.successes += succeeded
    tally.done += 1
    return succeeded


def _branch_off_rollouts(env: InProcessEnv, reader: SceneReader, writer, rollouts,
                         branch_every: int, branch_steps: int, teacher,
                         tally: _Tally) -> tuple[bool, list[bool]]:  # fmt: skip
    """`_roll_and_branch` for each (seed, actor) of `rollouts`, then close `env`; whether Ctrl-C
    interrupted them, and whether each rollout run solved the task."""
    solved = []
    try:
        for seed, actor in rollouts:
            solved.append(_roll_and_branch(env, reader, writer, actor, seed, branch_every,
                                           branch_steps, teacher, tally))  # fmt: skip
    except KeyboardInterrupt:
        return True, solved
    finally:
        env.close()
    return False, solved


def collect_recovery(
    checkpoint: str, task: str, episodes: int, out: str | Path, seed: int = 0,
    branch_every: int = 8, branch_steps: int = 24, execute: int = 2, progress: bool = True,
    servo_feedforward: bool = SIM_SERVO_FEEDFORWARD, teacher: str | None = None,
    delay_steps: int = 0,
) -> dict:  # fmt: skip
    """Roll `checkpoint` on `task` (seeds seed, seed+1, ...), branching the expert (or the
    `teacher` checkpoint) off it; `servo_feedforward`: on the simulated servo that tracks its
    setpoint's velocity; `delay_steps`: the rollout's chunks run that much after their frames, so
    that the branches start where the policy goes through the stack."""

    if seed + episodes > 90000:
        raise ValueError("seeds >= 90000 are reserved for evaluation")
    policy = load_policy("torch", checkpoint, seed=0)
    if execute + delay_steps > policy.spec.chunk_len:
        raise ValueError(f"--execute {execute} + --delay-steps {delay_steps} exceed the chunk's "
                         f"{policy.spec.chunk_len} actions")  # fmt: skip
    size = policy.spec.cameras[0].height
    robot = policy.spec.robot or "fr3"
    teacher_policy = _teacher_for(teacher, policy.spec.sensors, robot)
    writer = task_dataset_writer(out, size, robot)
    env = InProcessEnv(task, size, robot=robot, servo_feedforward=servo_feedforward)
    student = PolicyActor(policy, env.sim.robot, execute, delay_steps)
    taught_by = None if teacher_policy is None else PolicyActor(
        teacher_policy, env.sim.robot, execute, delay_steps)  # fmt: skip
    reader = SceneReader(env.model, scene_colours())
    tally, started = _Tally(), time.perf_counter()
    rollouts = tqdm([(seed + k, student) for k in range(episodes)], desc=f"recovery {task}",
                    disable=not progress)  # fmt: skip
    interrupted, _ = _branch_off_rollouts(env, reader, writer, rollouts, branch_every,
                                          branch_steps, taught_by, tally)  # fmt: skip
    return {
        "task": task, "interrupted": interrupted, **tally.summary(),
        "policy_success_rate": tally.successes / max(tally.done, 1),
        "seconds": round(time.perf_counter() - started, 1), "out": str(out),
        "checkpoint": checkpoint, "seed": seed, "branch_every": branch_every,
        "branch_steps": branch_steps, "execute": execute, "delay_steps": delay_steps,
        "servo_feedforward": servo_feedforward, "teacher": teacher,
    }  # fmt: skip


def collect_replay_recovery(
    replay: str | Path, task: str, out: str | Path, robot: str = "fr3", image_size: int = 96,
    branch_every: int = 8, branch_steps: int = 24, execute: int = 2, progress: bool = True,
    servo_feedforward: bool = SIM_SERVO_FEEDFORWARD, teacher: str | None = None,
) -> dict:  # fmt: skip
    """Branch the expert (or the `teacher` checkpoint) off product-path episodes of `task`
    recorded in `replay` (`vla-runtime eval --trajectories`), replayed in the in-process
    simulator on their own seeds."""

    trajectories = load_trajectories(Path(replay), task, robot)
    if any(r.seed >= 90000 for r in trajectories):
        raise ValueError(f"{replay}: episodes of seeds >= 90000, reserved for evaluation, "
                         f"are not training data")  # fmt: skip
    teacher_policy = None if teacher is None else load_policy("torch", teacher, seed=0)
    if teacher_policy is not None:
        image_size = teacher_policy.spec.cameras[0].height
        if (teacher_policy.spec.robot or "fr3") != robot:
            raise ValueError(f"teacher {teacher} drives another arm than the {robot}")
    writer = task_dataset_writer(out, image_size, robot)
    env = InProcessEnv(task, image_size, robot=robot, servo_feedforward=servo_feedforward)
    taught_by = None if teacher_policy is None else PolicyActor(
        teacher_policy, env.sim.robot, execute)  # fmt: skip
    reader = SceneReader(env.model, scene_colours())
    tally, started = _Tally(), time.perf_counter()
    rollouts = tqdm([(r.seed, ReplayActor(r, env.sim.robot)) for r in trajectories],
                    desc=f"replay {task}", disable=not progress)  # fmt: skip
    interrupted, solved = _branch_off_rollouts(env, reader, writer, rollouts, branch_every,
                                               branch_steps, taught_by, tally)  # fmt: skip
    same_outcome = sum(s == r.success for s, r in zip(solved, trajectories, strict=False))
    return {
        "task": task, "interrupted": interrupted, **tally.summary(),
        "recorded_success_rate": sum(r.success for r in trajectories) / len(trajectories),
        # How faithfully the replay reproduces the recorded episodes.
        "replays_with_the_recorded_outcome": same_outcome / max(tally.done, 1),
        "seconds": round(time.perf_counter() - started, 1), "out": str(out),
        "replay": str(replay), "robot": robot, "branch_every": branch_every,
        "branch_steps": branch_steps, "servo_feedforward": servo_feedforward, "teacher": teacher,
    }  # fmt: skip


def _teacher_for(teacher: str | None, sensors, robot: str):
    """The teacher checkpoint's policy (same cameras and arm as the rolled-out one), or None."""
    if teacher is None:
        return None
    policy = load_policy("torch", teacher, seed=0)
    if policy.spec.sensors != sensors or (policy.spec.robot or "fr3") != robot:
        raise ValueError(f"teacher {teacher} sees other cameras or drives another arm than the "
                         f"rolled-out checkpoint")  # fmt: skip
    return policy
