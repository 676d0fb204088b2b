"""`vla-runtime eval`: closed-loop episodes of a checkpoint on a task; success rate, time to
completion and runtime metrics as one JSON object.

Paths (`--via`):
- `stack` (default): the product path in real time, exactly the stack `vla-runtime launch sim
  policy:=true task:=T` starts (cameras, engine, safety, streamer, sim driver); see
  data/stack_eval.py. Episodes stream to a JSONL file (`--out`, `--resume`).
- `jtc` (ablation): the node stack in lock-step — task sim driver, sim cameras, the engine node
  (`vla_runtime.nodes.engine`, run_mode on_request). Per cycle the harness publishes an
  inference request, waits for the engine's /vla/action_chunk computed from the frames of the
  current sim time, sends that chunk (clipped to the joint limits, `clip_to_limits`) to the
  arm's JointTrajectoryController topic (a chunk is a JTC message by design) and advances
  `--execute` control periods of physics. Deterministic (the engine's latency does not cost sim
  time); the engine's wall-clock latency is measured and reported. `--realtime` runs the driver
  at real-time factor 1 instead, so latency costs sim time (what dynamic_reach is about). Each
  chunk joins the running one as a real JTC joins it, unblended: in real time the step to its
  first action can trip the simulated arm's velocity reflex, which ends the run as FAILED.
  The streamer and safety nodes are not in this loop.
- `inprocess`: Policy + TaskSimulator + SceneRenderer in this process, no ROS: the same
  receding-horizon loop, a fast development tool.

Seeds >= 90000 are never used for training (`collect` refuses them); evaluation defaults to them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from std_msgs.msg import String
from tqdm import tqdm
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.delayed_chunks import DelayedChunks
from vla_runtime.core.gripper import max_opening
from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD, shipped_checkpoint
from vla_runtime.core.policy_checkpoint import checkpoint_image_size
from vla_runtime.core.reflex_events import parse_reflex
from vla_runtime.core.stats import compute_cost
from vla_runtime.data import stack_eval
from vla_runtime.data.eval_cli import DEFAULT_EXECUTE, EVAL_SEED, build_parser
from vla_runtime.engine.checkpoint import load_checkpoint, load_spec, policy_options
from vla_runtime.engine.earlier_frames import FrameHistory
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import Observation, PolicyError, chunk_to_positions
from vla_runtime.ros.messages import chunk_from_msg, chunk_msg, to_seconds
from vla_runtime.sim.env import CommandRefused, InProcessEnv, clip_to_limits
from vla_runtime.sim.tasks import (
    CONTROL_DT,
    SceneReader,
    is_success,
    scene_colours,
    task_milestones,
)
from vla_runtime.stack.resolver import StackError, coerce_scalar
from vla_runtime.stack.sim_harness import REPUBLISH_S, STARTUP_TIMEOUT_S, STEP_TIMEOUT_S, RosEnv


@dataclass
class EpisodeResult:
    seed: int
    success: bool
    time_s: float | None  # sim time from the first action to success
    chunks: int
    latencies_ms: list[float] = field(default_factory=list)
    steps: int = 0  # control steps run
    engine_ms: list[float] = field(default_factory=list)  # engine `total_ms` per chunk
    modes: list[str] = field(default_factory=list)  # compute mode each chunk actually ran
    milestones_s: dict = field(default_factory=dict)  # sim s from the start to each task stage
    refused: str = ""  # why the simulated arm refused a command (its reflex ended the episode)


def _percentile(values, q):
    return float(np.percentile(values, q)) if len(values) else None


def summarise(task, results: list[EpisodeResult], settings: dict) -> dict:
    latencies = [x for r in results for x in r.latencies_ms]
    times = [r.time_s for r in results if r.success]
    n = len(results)
    return {
        "task": task,
        "episodes": n,
        "success_rate": sum(r.success for r in results) / n if n else None,
        "successes": sum(r.success for r in results),
        "time_to_success_s": {
            "mean": float(np.mean(times)) if times else None,
            "p50": _percentile(times, 50),
            "p95": _percentile(times, 95),
        },
        "inference_latency_ms": {
            "p50": _percentile(latencies, 50),
            "p95": _percentile(latencies, 95),
            "max": max(latencies) if latencies else None,
            "count": len(latencies),
        },
        "chunks_per_episode": float(np.mean([r.chunks for r in results])) if n else None,
        "milestones_s": stack_eval.summarise_milestones([r.milestones_s for r in results]),
        "failed_seeds": [r.seed for r in results if not r.success],
        "refused_episodes": sum(bool(r.refused) for r in results),
        "refusals": {r.seed: r.refused for r in results if r.refused},
        **_engine_cost(results),
        **settings,
    }


def _engine_cost(results: list[EpisodeResult]) -> dict:
    seconds = sum(r.steps for r in results) * CONTROL_DT
    engine_ms = [x for r in results for x in r.engine_ms]
    return compute_cost(engine_ms, [m for r in results for m in r.modes], seconds)


# ------------------------------------------------------------------------------ in-process


def _run_periods(periods, setup, reader, result: EpisodeResult, steps: int, frame):
    """Run control periods (callables returning the next frame) until success or the episode's
    step limit; returns (steps run so far, latest frame)."""
    for advance in periods:
        frame = advance()
        steps += 1
        snapshot = reader.snapshot(frame.qpos)
        stack_eval.first_times(result.milestones_s, task_milestones(setup, snapshot),
                               steps * CONTROL_DT)  # fmt: skip
        if is_success(setup, snapshot):
            result.success, result.time_s = True, steps * CONTROL_DT
            break
        if steps >= setup.max_steps:
            break
    return steps, frame


def evaluate_in_process(
    checkpoint: str, task: str, episodes: int, seed: int = EVAL_SEED,
    execute: int = DEFAULT_EXECUTE, progress: bool = True, noise_scale: float | None = None,
    servo_feedforward: bool = SIM_SERVO_FEEDFORWARD, delay_steps: int = 0,
) -> dict:  # fmt: skip
    """Development tool: no ROS, same loop as the stack path; `delay_steps`: each chunk runs
    that many control steps after its frame, as in real time (core/delayed_chunks.py)."""

    policy = load_policy("torch", checkpoint, seed=0, noise_scale=noise_scale)
    size = policy.spec.cameras[0].height
    cameras = [c.name for c in policy.spec.sensors]
    env = InProcessEnv(task, size, cameras, robot=policy.spec.robot or "fr3",
                       servo_feedforward=servo_feedforward)  # fmt: skip
    reader = SceneReader(env.model, scene_colours())
    schedule = DelayedChunks(execute, delay_steps)
    results = []
    try:
        for k in tqdm(range(episodes), desc=f"eval {task}", disable=not progress):
            frame = env.reset(seed + k)
            setup = env.setup
            result = EpisodeResult(seed + k, False, None, 0)
            steps = 0
            history = FrameHistory(policy.spec)
            schedule.restart()
            while steps < setup.max_steps and not result.success:
                images = history.complete(frame.images, frame.time)
                obs = Observation(images, frame.state, setup.instruction, frame.time)
                t0 = time.perf_counter()
                chunk = policy.infer(obs)
                result.latencies_ms.append(1e3 * (time.perf_counter() - t0))
                result.chunks += 1
                rows = clip_to_limits(chunk_to_positions(chunk.actions, frame.state, policy.spec),
                                      env.sim.robot)  # fmt: skip
                actions = schedule.rows_to_run(rows, frame.state)
                periods = (lambda a=a, h=history: h.recorded(env.step(a[:-1], float(a[-1])))
                           for a in actions)  # fmt: skip
                try:
                    steps, frame = _run_periods(periods, setup, reader, result, steps, frame)
                except CommandRefused as exc:  # the arm's reflex: a failed episode
                    result.refused = str(exc)
                    break
            results.append(result)
    finally:
        env.close()
    settings = {"via": "inprocess", "seed": seed, "execute": execute, "delay_steps": delay_steps,
                "checkpoint": checkpoint, "servo_feedforward": servo_feedforward}  # fmt: skip
    return summarise(task, results, {**settings, "noise_scale": policy.noise_scale})


# ------------------------------------------------------------------------------ node stack


def evaluate_stack(
    checkpoint: str, task: str, episodes: int, seed: int = EVAL_SEED,
    execute: int = DEFAULT_EXECUTE, progress: bool = True, realtime: bool = False,
    engine_params: dict | None = None, scheduler: dict | None = None,
    noise_scale: float | None = None, servo_feedforward: bool = SIM_SERVO_FEEDFORWARD,
) -> dict:  # fmt: skip
    """The sim stack's driver, cameras and engine (`engine_params`: more engine parameters);
    `scheduler`: also its scheduler node, with these parameters. Lock-step by default;
    `realtime`: the driver runs at real-time factor 1, so the engine's latency passes in sim
    time too (the chunk's first actions may already be past when it arrives: the JTC joins the
    trajectory at the current time, as ros2_control's does)."""

    loaded = load_checkpoint(checkpoint)
    spec = loaded.spec
    noise_scale = policy_options(loaded, {"noise_scale": noise_scale}).get("noise_scale", 1.0)
    size = spec.cameras[0].height
    # The harness forwards whole chunks: no plan to guide the next one with.
    arguments = {"checkpoint": os.path.abspath(checkpoint), "plan_guidance": False,
                 "scheduler": scheduler is not None, "robot": spec.robot or "fr3",
                 "servo_feedforward": servo_feedforward}  # fmt: skip
    parameters = {
        "engine": {"noise_scale": float(noise_scale), **(engine_params or {})},
        "scheduler": scheduler or {},
    }
    nodes = ("engine", "scheduler") if scheduler is not None else ("engine",)
    env = RosEnv(task, size, realtime, nodes, arguments, parameters)
    stack = env.stack
    chunks: list = []
    stack.node.create_subscription(JointTrajectory, topics.ACTION_CHUNK, chunks.append, 10)
    engine_stats: dict[int, dict] = {}  # chunks_published -> values of its OK status

    def on_stats(array) -> None:
        for status in array.status:
            values = {kv.key: kv.value for kv in status.values}
            if status.level == status.OK and "chunks_published" in values:
                engine_stats[int(values["chunks_published"])] = values

    stack.node.create_subscription(DiagnosticArray, topics.ENGINE_STATS, on_stats, 50)
    published = 0  # chunks the engine has published so far (its stats count them)
    request_pub = stack.node.create_publisher(JointTrajectory, topics.INFERENCE_REQUEST, 10)
    reflexes: list[str] = []  # the simulated arm's refusals, as its driver reports them

    def on_driver_event(msg) -> None:
        event = parse_reflex(msg.data)
        if event is not None:
            reflexes.append(str(event.get("reason", "")))

    stack.node.create_subscription(String, topics.DRIVER_EVENTS, on_driver_event, 50)
    reader = SceneReader(env.model, scene_colours())
    results = []

    def infer(t_obs: float, timeout_s: float):
        """Ask the engine for a chunk from the frames of `t_obs`; (chunk msg, wall latency)."""
        deadline = time.monotonic() + timeout_s
        asked = time.monotonic()
        # In lock-step the frames of t_obs went out once: an engine that subscribed after that
        # (a slow start) or lost them gets them again while it is waited for.
        wait = stack.spin_until if realtime else stack.wait_republishing
        while True:
            chunks.clear()
            t0 = time.perf_counter()
            request_pub.publish(chunk_msg([], 0.0, [], []))  # a request without a plan
            try:
                wait(lambda: bool(chunks), min(5.0, timeout_s), "an action chunk")
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
                continue
            latency = 1e3 * (time.perf_counter() - t0)
            msg = chunks[-1]
            stamp = to_seconds(msg.header.stamp)
            if abs(stamp - t_obs) < 1e-4 or (realtime and stamp >= t_obs - 1e-4):
                return msg, latency
            if time.monotonic() > deadline:  # the engine keeps using older frames
                raise TimeoutError(f"chunks stamped {stamp:.3f}, frames are at {t_obs:.3f}")
            if not realtime and time.monotonic() - asked > REPUBLISH_S:
                stack.republish()  # the engine's frames of t_obs may have been lost on the way
                asked = time.monotonic()
            time.sleep(0.01)

    try:
        for k in tqdm(range(episodes), desc=f"eval {task}", disable=not progress):
            frame = env.reset(seed + k)
            setup = env.setup
            result = EpisodeResult(seed + k, False, None, 0)
            steps, first = 0, True
            while steps < setup.max_steps and not result.success:
                msg, latency = infer(frame.time, STARTUP_TIMEOUT_S if first else STEP_TIMEOUT_S)
                # the engine publishes a chunk's stats right after the chunk
                stack.spin_until(lambda n=published: max(engine_stats, default=0) > n,
                                 STEP_TIMEOUT_S, "the engine's stats")  # fmt: skip
                published = max(engine_stats)
                values = engine_stats[published]
                result.engine_ms.append(float(values["total_ms"]))
                result.modes.append(values["mode"])
                if not first:  # the first includes the engine's warm-up
                    result.latencies_ms.append(latency)
                first = False
                result.chunks += 1
                chunk = chunk_from_msg(msg)
                rows = clip_to_limits(chunk.positions, stack.robot, max_opening(stack.robot))
                # the chunk is a JTC trajectory
                stack.command_pub.publish(
                    chunk_msg(chunk.joint_names, msg.header.stamp, chunk.times, rows)
                )
                periods = (env.advance for _ in range(min(execute, len(chunk.times))))
                steps, frame = _run_periods(periods, setup, reader, result, steps, frame)
                if reflexes:
                    result.refused = reflexes[0]
                    break
            result.steps = steps
            results.append(result)
            if result.refused:  # the arm stays latched until an operator recovers it
                break
    finally:
        env.close()
    settings = {"via": "jtc", "seed": seed, "execute": execute, "checkpoint": checkpoint,
                "noise_scale": noise_scale, "servo_feedforward": servo_feedforward}  # fmt: skip
    return summarise(task, results, {**settings, "lockstep": not realtime})


def eval_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    args.ckpt = args.ckpt or str(shipped_checkpoint(args.robot or "fr3", args.servo_feedforward))
    if not os.path.isdir(args.ckpt):
        parser.error(f"--ckpt {args.ckpt}: no such checkpoint directory")
    try:
        spec = load_spec(args.ckpt)
    except PolicyError as exc:
        parser.error(f"--ckpt {args.ckpt}: not a usable checkpoint ({exc})")
    robot = spec.robot or "fr3"  # older checkpoints: FR3 only
    if args.robot and args.robot != robot:
        parser.error(f"--ckpt {args.ckpt} was trained for {robot}, not {args.robot}")
    if args.delay_steps and args.via != "inprocess":
        parser.error("--delay-steps: the in-process path's (--via inprocess)")
    chunk_len = spec.chunk_len
    if args.via == "inprocess" and not (
        0 <= args.delay_steps <= args.execute and args.execute + args.delay_steps <= chunk_len
    ):
        parser.error(f"--delay-steps must be in [0, --execute] and --execute + --delay-steps at "
                     f"most the checkpoint's chunk length {chunk_len}")  # fmt: skip
    if args.seed < EVAL_SEED:
        print(f"warning: seeds below {EVAL_SEED} may have been used for training", file=sys.stderr)
    if args.via == "stack":
        overrides = {}
        for item in args.set:
            name, sep, value = item.partition(":=")
            if not sep or not name:
                parser.error(f"--set {item!r}: expected NAME:=VALUE")
            overrides[name] = coerce_scalar(value)
        try:
            image_size = checkpoint_image_size(args.ckpt)
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"--ckpt {args.ckpt}: not a usable checkpoint ({exc!r})")
        overrides.update(checkpoint=os.path.abspath(args.ckpt), stream_mode=args.mode,
                         image_size=image_size, robot=robot)  # fmt: skip
        overrides["servo_feedforward"] = args.servo_feedforward
        if args.backend:
            overrides["backend"] = args.backend
        if args.scheduler:
            overrides["scheduler"] = True
        if args.noise_scale is not None:
            parser.error("--noise-scale: the stack uses the checkpoint's recommendation")
        out = Path(args.out or f"runs/eval_{args.task}.jsonl")

        def show(record):
            if not args.quiet:
                tqdm.write(stack_eval.format_episode(record), file=sys.stderr)

        try:
            summary = stack_eval.eval_stack(
                args.task, args.episodes, args.seed, overrides, out, args.resume,
                not args.no_progress, Path(args.plot) if args.plot else None, show,
                Path(args.report) if args.report else None,
                Path(args.trajectories) if args.trajectories else None,
            )  # fmt: skip
        except StackError as exc:
            print(f"vla-runtime eval: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(summary, indent=None if args.json else 2))
        if not args.quiet:
            print(stack_eval.format_summary(summary), file=sys.stderr)
            print(stack_eval.format_chain(summary), file=sys.stderr)
        reason = stack_eval.failure_reason(summary)
        if reason:
            print(f"vla-runtime eval: FAILED: {reason}", file=sys.stderr)
            return 1
        return 0
    if args.report or args.trajectories:
        parser.error("--report and --trajectories: of the product path (--via stack)")
    if args.via == "inprocess":
        summary = evaluate_in_process(
            args.ckpt, args.task, args.episodes, args.seed, args.execute, not args.no_progress,
            args.noise_scale, args.servo_feedforward, args.delay_steps,
        )  # fmt: skip
    else:
        summary = evaluate_stack(
            args.ckpt, args.task, args.episodes, args.seed, args.execute, not args.no_progress,
            realtime=args.realtime, noise_scale=args.noise_scale,
            servo_feedforward=args.servo_feedforward,
        )  # fmt: skip
    print(json.dumps(summary, indent=None if args.json else 2))
    if summary["episodes"] < args.episodes:  # a refusal latched the arm: the rest cannot run
        seed, reason = next(iter(summary["refusals"].items()))
        print(f"vla-runtime eval: FAILED: the simulated arm refused a command in episode {seed} "
              f"({reason}); {summary['episodes']} of {args.episodes} episodes ran",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(eval_main())
