"""Teleop-free data collection: scripted experts drive the task simulator, episodes go to a
LeRobot v3 dataset with their success label (failed expert episodes are kept, labelled).

Two environments behind one small interface (`reset(seed) -> Frame`, `step(q, width) -> Frame`):

- `stack.sim_harness.RosEnv` (the default, `--mode lockstep|realtime`): the real node stack. The
  task sim driver (`vla_runtime.drivers.sim.task_driver`) and one sim camera node per camera run as
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

import json
import math
import sys
import time
from pathlib import Path

from tqdm import tqdm

from vla_runtime.core.help_text import SERVO_FEEDFORWARD_OPTION, CommandParser
from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD
from vla_runtime.core.robot import SIMULATED_ROBOTS
from vla_runtime.data.expert_recording import (
    run_expert_episode,
    sigint_deferred,
    sigint_noted,
    task_dataset_writer,
)
from vla_runtime.data.perception_collect import collect_with_perception
from vla_runtime.data.recovery import collect_recovery, collect_replay_recovery
from vla_runtime.engine.checkpoint import load_spec
from vla_runtime.engine.policy import PolicyError
from vla_runtime.sim.env import DEFAULT_IMAGE_SIZE, InProcessEnv
from vla_runtime.sim.tasks import (
    TASKS,
    SceneReader,
    check_task,
    scene_colours,
)
from vla_runtime.stack.resolver import coerce_scalar
from vla_runtime.stack.sim_harness import RosEnv


def collect(
    task: str,
    episodes: int,
    out: str | Path,
    seed: int = 0,
    mode: str = "lockstep",
    image_size: int = DEFAULT_IMAGE_SIZE,
    progress: bool = True,
    robot: str = "fr3",
    servo_feedforward: bool = SIM_SERVO_FEEDFORWARD,
) -> dict:
    """Collect `episodes` expert episodes of `task` on `robot` (seeds seed, seed+1, ...) into
    `out`; `servo_feedforward`: on the simulated servo that tracks its setpoint's velocity."""

    check_task(task)
    if seed + episodes > 90000:
        raise ValueError("seeds >= 90000 are reserved for evaluation")
    writer = task_dataset_writer(out, image_size, robot)
    env = make_env(task, mode, image_size, robot, servo_feedforward)
    reader = SceneReader(env.model, scene_colours())
    done = successes = frames = 0
    started = time.perf_counter()
    interrupted = False
    bar = tqdm(total=episodes, desc=f"collect {task}", unit="ep", disable=not progress)
    with sigint_noted() as sigint:
        try:
            for k in range(episodes):
                episode, figures = run_expert_episode(env, task, seed + k, reader)
                with sigint_deferred() as deferred:  # a finished episode is committed, counted
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
        except RuntimeError:
            if not sigint.hit:
                raise
            interrupted = True  # the Ctrl-C landed inside a C++ call
        finally:
            bar.close()
            env.close()
    elapsed = time.perf_counter() - started
    return {
        "task": task,
        "robot": robot,
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
        "servo_feedforward": servo_feedforward,
    }


def make_env(task: str, mode: str, image_size: int, robot: str = "fr3",
             servo_feedforward: bool = SIM_SERVO_FEEDFORWARD):  # fmt: skip
    if mode == "inprocess":
        return InProcessEnv(task, image_size, robot=robot, servo_feedforward=servo_feedforward)
    arguments = {"robot": robot, "servo_feedforward": servo_feedforward}
    return RosEnv(task, image_size, realtime=mode == "realtime", arguments=arguments)


def stack_arguments(items: list[str]) -> dict:
    """NAME:=VALUE items as stack arguments (typed as the launcher types them)."""
    arguments = {}
    for item in items:
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise ValueError(f"stack arguments are NAME:=VALUE, got {item!r}")
        arguments[name] = coerce_scalar(value)
    return arguments


def collect_main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="vla-runtime collect", description="scripted-expert data collection (LeRobot v3)"
    )
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--episodes", type=int, help="required, except with --replay")
    parser.add_argument("--out", required=True, help="dataset directory (appended if it exists)")
    parser.add_argument("--seed", type=int, default=0, help="first episode seed (< 90000)")
    parser.add_argument(
        "--mode",
        choices=("lockstep", "realtime", "inprocess"),
        default="lockstep",
        help="lockstep/realtime: through the ROS node stack; inprocess: no ROS (fast dev tool)",
    )
    parser.add_argument("--image-size", type=int, default=DEFAULT_IMAGE_SIZE)
    parser.add_argument(
        "--robot", choices=SIMULATED_ROBOTS, help="simulated arm (default fr3; recovery: CKPT's)"
    )
    parser.add_argument("--servo-feedforward", **SERVO_FEEDFORWARD_OPTION)
    recovery = parser.add_argument_group(
        "recovery branches (DAgger-style, in-process): run a policy, branch the expert off it"
    )
    recovery.add_argument("--recover-from", metavar="CKPT", help="policy checkpoint to roll out")
    recovery.add_argument("--replay", metavar="DIR",
                          help="instead, replay the product-path episodes of --task that `eval "
                               "--trajectories DIR` kept and branch off them")  # fmt: skip
    recovery.add_argument("--branch-every", type=int, default=8, help="control steps")
    recovery.add_argument("--branch-steps", type=int, default=24, help="expert steps per branch")
    recovery.add_argument("--execute", type=int, default=2, help="policy actions per chunk")
    recovery.add_argument("--delay-steps", type=int, default=0,
                          help="each chunk runs this many control steps after its frame, as "
                               "through the stack (see `eval --delay-steps`)")  # fmt: skip
    recovery.add_argument("--teacher", metavar="CKPT",
                          help="a policy checkpoint teaches the branches instead of the scripted "
                               "expert (same cameras and arm as --recover-from)")  # fmt: skip
    perception = parser.add_argument_group(
        "perception (no privileged state): cameras find the cubes, the robot resets the scene"
    )
    perception.add_argument("--perception", action="store_true",
                            help="the expert acts on the calibrated cameras through the product "
                                 "stack (safety, streamer, driver), labels success from them and "
                                 "resets the workcell itself; tasks reach, push, pick")  # fmt: skip
    perception.add_argument("--sim", action="store_true", help="on the simulated arm (the default)")
    perception.add_argument("--real", action="store_true",
                            help="on the franka stack (FR3), given its arguments as NAME:=VALUE "
                                 "(direct:=true robot_ip:=..., or franky_sim:=true direct:=true "
                                 "for a dry run on franky-sim); implies --perception")  # fmt: skip
    perception.add_argument(
        "--random-starts", type=float, default=0.0, metavar="FRACTION",
        help="this fraction of episodes starts from a random hand pose between home and the "
        "cubes instead of home (0-1; default 0)",
    )  # fmt: skip
    perception.add_argument(
        "--calibration-dir",
        help="the cameras' calibration (vla-runtime calibrate; default: the stack's cameras')",
    )
    parser.add_argument("arguments", nargs="*", metavar="NAME:=VALUE",
                        help="--real: the franka stack's arguments")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.episodes is None and not args.replay:
        parser.error("--episodes is required")
    if args.replay and args.episodes is not None:
        parser.error("--replay replays each episode it finds: no --episodes")
    if args.real and args.sim:
        parser.error("--real and --sim: choose one")
    if args.arguments and not args.real:
        parser.error(f"stack arguments ({' '.join(args.arguments)}) are for --real")
    if args.random_starts and not (args.perception or args.real):
        parser.error("--random-starts is for --perception and --real collection")
    if args.perception or args.real:
        if args.recover_from or args.replay:
            parser.error("--perception and --recover-from / --replay do not combine")
        try:
            real = stack_arguments(args.arguments) if args.real else None
            summary = collect_with_perception(
                args.task, args.episodes, args.out, args.seed, args.image_size,
                args.robot or "fr3", args.calibration_dir, progress=not args.no_progress,
                real=real, random_starts=args.random_starts,
            )  # fmt: skip
        except (ValueError, FileNotFoundError) as exc:
            parser.error(str(exc))
        print(json.dumps(summary, indent=None if args.json else 2))
        error = summary.get("error")
        if error == "interrupted":
            return 130
        if error or not summary["episodes"]:
            print(f"vla-runtime collect: failed: {error or 'no episode was recorded'}",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if args.teacher and not (args.recover_from or args.replay):
        parser.error("--teacher teaches the branches of --recover-from or --replay")
    if args.replay:
        if args.recover_from:
            parser.error("--replay and --recover-from: choose one")
        try:
            summary = collect_replay_recovery(
                args.replay, args.task, args.out, args.robot or "fr3", args.image_size,
                args.branch_every, args.branch_steps, args.execute, not args.no_progress,
                args.servo_feedforward, args.teacher,
            )  # fmt: skip
        except (ValueError, OSError, PolicyError) as exc:
            parser.error(str(exc))
        print(json.dumps(summary, indent=None if args.json else 2))
        return 130 if summary["interrupted"] else 0
    if args.recover_from:
        try:
            robot = load_spec(args.recover_from).robot or "fr3"
        except (OSError, PolicyError) as exc:
            parser.error(f"--recover-from {args.recover_from} is not a checkpoint ({exc})")
        if args.robot and args.robot != robot:
            parser.error(f"--recover-from {args.recover_from} was trained for {robot}, not "
                         f"{args.robot}")  # fmt: skip
        if args.teacher:
            try:
                load_spec(args.teacher)
            except (OSError, PolicyError) as exc:
                parser.error(f"--teacher {args.teacher} is not a checkpoint ({exc})")
        try:
            summary = collect_recovery(
                args.recover_from, args.task, args.episodes, args.out, args.seed,
                args.branch_every, args.branch_steps, args.execute, progress=not args.no_progress,
                servo_feedforward=args.servo_feedforward, teacher=args.teacher,
                delay_steps=args.delay_steps,
            )  # fmt: skip
        except ValueError as exc:
            parser.error(str(exc))
        print(json.dumps(summary, indent=None if args.json else 2))
        return 130 if summary["interrupted"] else 0
    summary = collect(
        args.task, args.episodes, args.out, args.seed, args.mode, args.image_size,
        progress=not args.no_progress, robot=args.robot or "fr3",
        servo_feedforward=args.servo_feedforward,
    )  # fmt: skip
    print(json.dumps(summary, indent=None if args.json else 2))
    return 130 if summary["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(collect_main())
