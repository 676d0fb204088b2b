"""Teleop-free data collection: scripted experts drive the task simulator, episodes go to a
LeRobot v3 dataset with their success label (failed expert episodes are kept, labelled).

Two environments behind one small interface (`reset(seed) -> Frame`, `step(q, width) -> Frame`):

- `nodes.expert.RosEnv` (the default, `--mode lockstep|realtime`): the real node stack. The
  task sim driver (`vla_runtime.nodes.task_driver`) and one sim camera node per camera run as
  processes; the collector is an rclpy node on the runtime's topics: it reads the camera
  images, /joint_states and /sim/scene_state (the expert's known state), publishes the
  instruction and sends each action as a one-point JointTrajectory to the arm controller topic.
  Lock-step advances physics one control period per /sim/step request (deterministic, as fast
  as the machine allows).
- `InProcessEnv` (`--mode inprocess`): the same simulator and renderers in this process, no
  ROS; a fast development tool producing the same dataset (bit-identical to lock-step, see
  test/integration/test_collect.py).

The dataset is committed episode by episode: Ctrl-C loses only the episode in progress.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # offscreen; before mujoco is first imported

import numpy as np  # noqa: E402

from vla_runtime.data.lerobot_format import Episode, LeRobotWriter  # noqa: E402
from vla_runtime.sim.tasks import (  # noqa: E402
    CONTROL_DT,
    TASKS,
    SceneReader,
    check_task,
    is_success,
    scene_colours,
)

DEFAULT_IMAGE_SIZE = 96
CAMERAS = ("scene", "wrist")
POST_SUCCESS_STEPS = 10  # frames kept after success so the policy also learns to settle
STATE_NAMES = [f"fr3_joint{i}" for i in range(1, 8)] + ["gripper_width"]
# observation.environment_state (base frame), for auxiliary losses: the named cube's centre,
# then every cube's centre in a fixed colour order. The fixed-order part teaches the encoder to
# find each colour without the instruction; the target part, which one the instruction names.
ENV_STATE_NAMES = [f"{cube}_{axis}" for cube in ("target", *scene_colours()) for axis in "xyz"]
PHYSICS_STEPS = round(CONTROL_DT / 0.001)


@dataclass
class Frame:
    """One synchronised observation: images, policy state (7 joints + width), full qpos."""

    time: float
    images: dict[str, np.ndarray]
    state: np.ndarray
    qpos: np.ndarray


class InProcessEnv:
    """Simulator + renderers in this process (no ROS): fast and deterministic."""

    def __init__(self, task: str, image_size: int = DEFAULT_IMAGE_SIZE, cameras=CAMERAS):
        from vla_runtime.sim.render import SceneRenderer
        from vla_runtime.sim.tasks import TaskSimulator

        self.sim = TaskSimulator(task)
        self.renderers = {
            c: SceneRenderer(self.sim.xml, c, image_size, image_size) for c in cameras
        }
        self.model = self.sim.model
        self._names = (*self.sim.robot.joints, self.sim.robot.gripper_joints[0])

    @property
    def setup(self):
        return self.sim.setup

    def _frame(self) -> Frame:
        qpos = self.sim.qpos
        images = {c: r.render(qpos) for c, r in self.renderers.items()}
        state = np.append(self.sim.arm_positions, self.sim.gripper_width).astype(np.float32)
        return Frame(self.sim.time, images, state, qpos)

    def reset(self, seed: int) -> Frame:
        self.sim.randomize(seed)
        self.sim.step(PHYSICS_STEPS)  # settle one period, like the ROS path
        return self._frame()

    def step(self, q, width) -> Frame:
        reason = self.sim.set_trajectory(self._names, [[*q, width / 2]], [CONTROL_DT])
        if reason is not None:
            raise RuntimeError(f"expert command rejected: {reason}")
        self.sim.step(PHYSICS_STEPS)
        return self._frame()

    def close(self) -> None:
        for renderer in self.renderers.values():
            renderer.close()


class ExpertRecorder:
    """A scripted expert driving `env` from the current state, recording each step as a frame
    (images, state, privileged env state, the expert's action, the success detector)."""

    def __init__(self, env, reader: SceneReader):
        from vla_runtime.data.experts import ArmKinematics, ScriptedExpert

        self.env, self.reader, self.setup = env, reader, env.setup
        self.expert = ScriptedExpert(self.setup, ArmKinematics(env.model))
        self._target = env.model.joint(self.setup.target_body).qposadr[0]
        self.images: dict[str, list] = {}
        self.states, self.actions, self.flags, self.env_states = [], [], [], []

    def step(self, frame: Frame) -> tuple[Frame, bool]:
        """Record `frame` with the expert's action, execute it; the next frame and whether the
        task was solved in `frame`."""
        setup, target = self.setup, self._target
        snapshot = self.reader.snapshot(frame.qpos)
        flag = is_success(setup, snapshot)
        q, width = self.expert.act(snapshot, frame.state[:7], frame.qpos[target + 3 : target + 7])
        for camera, image in frame.images.items():
            self.images.setdefault(camera, []).append(image)
        self.states.append(frame.state)
        self.env_states.append(
            np.concatenate([snapshot.cubes[setup.target], *snapshot.cubes.values()])
        )
        self.actions.append(np.append(q, width).astype(np.float32))
        self.flags.append(flag)
        return self.env.step(q, width), flag

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


def task_dataset_writer(out: str | Path, image_size: int) -> LeRobotWriter:
    """The LeRobot dataset (appended if it exists) of the task suite's episodes."""
    return LeRobotWriter(
        out,
        fps=1.0 / CONTROL_DT,
        cameras={c: (image_size, image_size) for c in CAMERAS},
        state_names=STATE_NAMES,
        action_names=STATE_NAMES,
        env_state_names=ENV_STATE_NAMES,
    )


class _Deferred:
    hit = False


@contextlib.contextmanager
def sigint_deferred():
    """Hold Ctrl-C (SIGINT) back while the block runs; `.hit` says whether one came. Only the
    main thread can own signal handlers; elsewhere the block runs unprotected."""
    deferred = _Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield deferred
        return

    def hold(signum, frame):
        deferred.hit = True

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield deferred
    finally:
        signal.signal(signal.SIGINT, previous)


def collect(
    task: str,
    episodes: int,
    out: str | Path,
    seed: int = 0,
    mode: str = "lockstep",
    image_size: int = DEFAULT_IMAGE_SIZE,
    progress: bool = True,
) -> dict:
    """Collect `episodes` expert episodes of `task` (seeds seed, seed+1, ...) into `out`."""
    from tqdm import tqdm

    check_task(task)
    if seed + episodes > 90000:
        raise ValueError("seeds >= 90000 are reserved for evaluation")
    writer = task_dataset_writer(out, image_size)
    env = make_env(task, mode, image_size)
    reader = SceneReader(env.model, scene_colours())
    done = successes = frames = 0
    started = time.perf_counter()
    interrupted = False
    bar = tqdm(total=episodes, desc=f"collect {task}", unit="ep", disable=not progress)
    try:
        for k in range(episodes):
            episode, figures = run_expert_episode(env, task, seed + k, reader)
            with sigint_deferred() as deferred:  # a finished episode is committed and counted
                writer.add_episode(episode)
                done += 1
                successes += figures["success"]
                frames += figures["frames"]
            if deferred.hit:
                raise KeyboardInterrupt
            bar.update(1)
            bar.set_postfix(success=f"{successes / done:.2f}")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
        env.close()
    elapsed = time.perf_counter() - started
    return {
        "task": task,
        "mode": mode,
        "episodes": done,
        "interrupted": interrupted,
        "expert_success_rate": successes / done if done else math.nan,
        "frames": frames,
        "seconds": round(elapsed, 2),
        "episodes_per_min": round(60.0 * done / elapsed, 2) if elapsed > 0 else math.nan,
        "dataset_episodes": writer.num_episodes,
        "out": str(out),
        "image_size": image_size,
        "seed": seed,
    }


def make_env(task: str, mode: str, image_size: int):
    if mode == "inprocess":
        return InProcessEnv(task, image_size)
    from vla_runtime.nodes.expert import RosEnv  # rclpy only when the node stack is used

    return RosEnv(task, image_size, realtime=mode == "realtime")


def collect_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vla-runtime collect", description="scripted-expert data collection (LeRobot v3)"
    )
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--out", required=True, help="dataset directory (appended if it exists)")
    parser.add_argument("--seed", type=int, default=0, help="first episode seed (< 90000)")
    parser.add_argument(
        "--mode",
        choices=("lockstep", "realtime", "inprocess"),
        default="lockstep",
        help="lockstep/realtime: through the ROS node stack; inprocess: no ROS (fast dev tool)",
    )
    parser.add_argument("--image-size", type=int, default=DEFAULT_IMAGE_SIZE)
    recovery = parser.add_argument_group(
        "recovery branches (DAgger-style, in-process): run a policy, branch the expert off it"
    )
    recovery.add_argument("--recover-from", metavar="CKPT", help="policy checkpoint to roll out")
    recovery.add_argument("--branch-every", type=int, default=8, help="control steps")
    recovery.add_argument("--branch-steps", type=int, default=24, help="expert steps per branch")
    recovery.add_argument("--execute", type=int, default=2, help="policy actions per chunk")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.recover_from:
        from vla_runtime.data.recovery import collect_recovery

        summary = collect_recovery(
            args.recover_from, args.task, args.episodes, args.out, args.seed,
            args.branch_every, args.branch_steps, args.execute, progress=not args.no_progress,
        )  # fmt: skip
        print(json.dumps(summary, indent=None if args.json else 2))
        return 130 if summary["interrupted"] else 0
    summary = collect(
        args.task, args.episodes, args.out, args.seed, args.mode, args.image_size,
        progress=not args.no_progress,
    )  # fmt: skip
    print(json.dumps(summary, indent=None if args.json else 2))
    return 130 if summary["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(collect_main())
