"""Recording scripted-expert episodes for the task suite's LeRobot datasets: the recorder that
drives an environment with the expert, one whole episode, the dataset writer, and holding Ctrl-C
back while an episode is committed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

import numpy as np

from vla_runtime.core.robot import load_robot
from vla_runtime.data.experts import ArmKinematics, ScriptedExpert
from vla_runtime.data.lerobot.writer import Episode, LeRobotWriter
from vla_runtime.sim.env import CAMERAS, Frame
from vla_runtime.sim.tasks import CONTROL_DT, SceneReader, is_success, scene_colours

POST_SUCCESS_STEPS = 10  # frames kept after success so the policy also learns to settle
# observation.environment_state (base frame), for auxiliary losses: the named cube's centre,
# then every cube's centre in a fixed colour order. The fixed-order part teaches the encoder to
# find each colour without the instruction; the target part, which one the instruction names.
ENV_STATE_NAMES = [f"{cube}_{axis}" for cube in ("target", *scene_colours()) for axis in "xyz"]


class ExpertRecorder:
    """A scripted expert driving `env` from the current state, recording each step as a frame
    (images, state, privileged env state, the expert's action, the success detector).
    `teacher`: acts in the expert's place (`act(frame, setup) -> (joint target, width)`)."""

    def __init__(self, env, reader: SceneReader, teacher=None):
        self.env, self.reader, self.setup = env, reader, env.setup
        robot = env.robot
        self.teacher = teacher
        if teacher is None:
            self.expert = ScriptedExpert(self.setup, ArmKinematics(env.model, robot.name))
        self._dof = robot.dof
        self._target = env.model.joint(self.setup.target_body).qposadr[0]
        self.images: dict[str, list] = {}
        self.states, self.actions, self.flags, self.env_states = [], [], [], []

    def step(self, frame: Frame) -> tuple[Frame, bool]:
        """Record `frame` with the expert's action, execute it; the next frame and whether the
        task was solved in `frame`."""
        setup, target = self.setup, self._target
        snapshot = self.reader.snapshot(frame.qpos)
        flag = is_success(setup, snapshot)
        arm, cube_quat = frame.state[: self._dof], frame.qpos[target + 3 : target + 7]
        if self.teacher is None:
            q, width = self.expert.act(snapshot, arm, cube_quat)
        else:
            q, width = self.teacher.act(frame, setup)
        for camera, image in frame.images.items():
            self.images.setdefault(camera, []).append(image)
        self.states.append(frame.state)
        self.env_states.append(
            np.concatenate([snapshot.cubes[setup.target], *snapshot.cubes.values()])
        )
        self.actions.append(np.append(q, width).astype(np.float32))
        self.flags.append(flag)
        return self.env.step(q, width), flag

    def forget_last(self) -> None:
        """Drop the last recorded step (its action was refused)."""
        for column in (*self.images.values(), self.states, self.env_states, self.actions):
            column.pop()
        self.flags.pop()

    def episode(self, success: bool, extra: dict) -> Episode:
        return Episode(
            images={c: np.stack(v) for c, v in self.images.items()},
            state=np.stack(self.states),
            action=np.stack(self.actions),
            task=self.setup.instruction,
            success=success,
            frame_success=np.array(self.flags),
            seed=self.setup.seed,
            env_state=np.asarray(self.env_states, np.float32),
            extra=extra,
        )


def run_expert_episode(env, task: str, seed: int, reader: SceneReader) -> tuple[Episode, dict]:
    """One scripted episode; returns it (success-labelled) and its figures."""
    frame = env.reset(seed)
    recorder = ExpertRecorder(env, reader)
    success_step = None
    for step in range(env.setup.max_steps):
        if success_step is not None and step - success_step >= POST_SUCCESS_STEPS:
            break
        frame, flag = recorder.step(frame)
        if flag and success_step is None:
            success_step = step
    success = success_step is not None
    extra = {"task": task, "success_time_s": None if not success else success_step * CONTROL_DT}
    return recorder.episode(success, extra), {"success": success, "frames": len(recorder.states)}


def state_names(robot: str) -> list[str]:
    """The policy state's (and action's) columns: the arm's joints, then the gripper width."""
    return [*load_robot(robot).joints, "gripper_width"]


def task_dataset_writer(out: str | Path, image_size: int, robot: str = "fr3") -> LeRobotWriter:
    """The LeRobot dataset (appended if it exists) of the task suite's episodes on `robot`."""
    names = state_names(robot)
    return LeRobotWriter(
        out,
        fps=1.0 / CONTROL_DT,
        cameras={c: (image_size, image_size) for c in CAMERAS},
        state_names=names,
        action_names=names,
        robot_type=robot,
        env_state_names=ENV_STATE_NAMES,
    )


class _Deferred:
    hit = False


def sigint_deferred():
    """Hold Ctrl-C (SIGINT) back while the block runs; `.hit` says whether one came. Only the
    main thread can own signal handlers; elsewhere the block runs unprotected."""
    return _sigint_recorded(interrupt=False)


def sigint_noted():
    """Ctrl-C (SIGINT) raises KeyboardInterrupt as usual, and `.hit` records that it came: one
    that lands inside a C++ call (rclpy taking a message) reaches Python as pybind11's
    RuntimeError ("Unable to convert call argument"), not as KeyboardInterrupt."""
    return _sigint_recorded(interrupt=True)


@contextlib.contextmanager
def _sigint_recorded(interrupt: bool):
    recorded = _Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield recorded
        return

    def handler(signum, frame):
        recorded.hit = True
        if interrupt:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield recorded
    finally:
        signal.signal(signal.SIGINT, previous)
