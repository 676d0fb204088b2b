"""`vla-runtime ab`: does the faster way to run a policy cost success or smoothness? Two engine
specs (A and B), the same checkpoint, the same full stack, paired episodes.

Each pair runs both arms on one scene seed, in an order that removes drift (`--order`:
ABBA by default). Every episode goes through the product path in real time (cameras, engine,
safety, streamer, arm); only the engine's stack arguments differ between the arms. With
`--sim` the simulated workcell resets each scene and judges success; without it the robot's
real stack runs and an operator starts and judges each episode with keys on stdin
(data/ab_operator.py). Episodes stream to OUT/episodes.jsonl as they finish and each stack's
run is recorded as a rosbag2 bag under OUT/bags, so Ctrl-C loses nothing and `--resume`
continues where the log ends. With `--sequential`, a paired SPRT stops the run once the
discordant pairs make the answer clear. The summary (JSON on stdout) holds per-arm figures,
the differences with confidence intervals and a one-sentence verdict; OUT/report.html shows
the plots.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from vla_runtime.core import topics
from vla_runtime.core.ab_plan import (
    completed_pairs,
    effective_episodes,
    episode_order,
    next_episode,
    parse_engine_spec,
    spec_text,
)
from vla_runtime.core.ab_stats import PairedSprt, rms_jerk
from vla_runtime.core.operator_episodes import OperatorEpisodes
from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.core.policy_checkpoint import checkpoint_image_size
from vla_runtime.core.robot import SIMULATED_ROBOTS
from vla_runtime.data import stack_eval
from vla_runtime.data.ab_cli import REAL_STACKS, build_parser
from vla_runtime.data.ab_operator import OperatorArm, OperatorConsole
from vla_runtime.data.ab_summary import summarise_ab
from vla_runtime.data.record import TopicRecorder
from vla_runtime.data.rosbag2_bag import BagWriter
from vla_runtime.engine.checkpoint import load_spec
from vla_runtime.engine.policy import PolicyError
from vla_runtime.stack.resolver import StackError, coerce_scalar, resolve_stack

LOG = "episodes.jsonl"


def arm_stacks(spec_a: dict, spec_b: dict, task: str, base: dict, robot: str, sim: bool) -> dict:
    """The stack of each arm: the robot in the simulated workcell, or its real stack with the
    policy on. A spec naming something the stack does not take is refused here, before any
    episode runs."""
    name, arguments = ("sim", {"task": task, "robot": robot}) if sim else REAL_STACKS[robot]
    stacks = {}
    for arm, spec in (("a", spec_a), ("b", spec_b)):
        try:
            stacks[arm] = resolve_stack(name, {**base, **arguments, **spec, "policy": True})
        except StackError as exc:
            raise ValueError(f"--{arm} {spec_text(spec)}: {exc}") from None
    return stacks


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextmanager
def interrupt_deferred():
    """Ctrl-C waits until the block is done: a half-written bag or log line would lose what
    the interrupt is meant to keep."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


class StackRecording:
    """Each stack's run as a rosbag2 bag (OUT/bags/NNN_ARM): what the arm was told and did,
    the chunks and their verdicts, the episode boundaries and the nodes' figures, so a reviewer
    can replay any episode. Images are left out (they would dwarf everything else)."""

    TOPICS = {topics.JOINT_STATES, topics.COMMAND, topics.ACTION_CHUNK, topics.CHECKED_CHUNK,
              topics.SAFETY_EVENTS, topics.DRIVER_EVENTS, topics.EPISODE, topics.ENGINE_STATS,
              topics.STREAMER_STATS}  # fmt: skip

    def __init__(self, out: Path) -> None:
        self.root = out / "bags"
        self.writer = None

    def start(self, node, arm: str) -> None:
        self.stop()
        self.root.mkdir(parents=True, exist_ok=True)
        index = len([p for p in self.root.iterdir() if p.is_dir()])
        self.writer = BagWriter(self.root / f"{index:03d}_{arm}")
        # The stack is up: every recorded topic has its publisher now.
        TopicRecorder(node, self.writer, self.TOPICS, announce=False).discover()

    def stop(self) -> None:
        with interrupt_deferred():
            if self.writer is not None:
                self.writer.close()
            self.writer = None


class SimulatedArms:
    """Episodes on the simulated stack: the harness resets the scene to each seed and judges
    success from the simulator."""

    operator = False

    def __init__(self, stacks: dict, task: str, recording: StackRecording) -> None:
        self.stacks, self.task, self.recording = stacks, task, recording
        self.harness, self.arm = None, None

    def open(self, arm: str) -> None:
        self.close()
        self.harness = stack_eval.StackHarness(self.stacks[arm], record_motion=True)
        self.arm = arm
        self.harness.warm_up(self.task)
        self.recording.start(self.harness.node, arm)

    def episode(self, seed: int):
        self.harness.forget_reports()
        try:
            self.harness.clear_latch(f"vla-runtime ab: episode seed {seed} starts; the stop "
                                     "latched in the episode before is over")  # fmt: skip
            record = stack_eval.run_episode(self.harness, self.task, seed)
        except (stack_eval.StackDied, stack_eval.StackStalled) as exc:
            kind = "stack_died" if isinstance(exc, stack_eval.StackDied) else "stalled"
            record = stack_eval.EpisodeRecord(seed, kind, False, None, 0.0, 0.0, str(exc))
            self.close()  # restarted for the next episode
            return "record", record, None
        t0 = float(self.harness.episodes[-1]["stamp"])
        return "record", record, commanded_jerk(self.harness, t0, record.sim_s)

    def close(self) -> None:
        self.recording.stop()
        if self.harness is not None:
            self.harness.close()
        self.harness, self.arm = None, None


class OperatorArms:
    """Episodes on a real arm's stack, started and judged by the operator's keys."""

    operator = True

    def __init__(
        self, stacks: dict, task: str, settings: dict, recording: StackRecording, console=None
    ) -> None:
        self.stacks, self.task, self.settings, self.recording = stacks, task, settings, recording
        self.console = console or OperatorConsole()
        self.keys = OperatorEpisodes()
        self.current, self.arm = None, None

    def open(self, arm: str) -> None:
        self.close()
        label = f"{arm.upper()}: {spec_text(self.settings[arm])}"
        self.console.say(f"starting the stack of arm {label}")
        self.current, self.arm = OperatorArm(self.stacks[arm], self.console, label), arm
        self.current.warm_up()
        self.recording.start(self.current.harness.node, arm)

    def episode(self, seed: int):
        self.console.say(f"episode: scene {seed}, arm {self.arm.upper()}")
        kind, value = self.current.episode(self.keys, seed, self.task)
        if kind != "record":
            return kind, value, None
        t0 = self.current.started_at
        return kind, value, commanded_jerk(self.current.harness, t0, value.sim_s)

    def close(self) -> None:
        self.recording.stop()
        if self.current is not None:
            self.current.close()
        self.current, self.arm = None, None


def run_ab(arms, task: str, plan: list, log: Path, sprt: PairedSprt | None, progress: bool):
    """Run the plan's episodes not yet in `log` (a discarded one runs again); returns the
    episodes that count and whether the SPRT stopped the run early."""
    lines = read_log(log)

    def state():
        episodes = effective_episodes(lines)
        done = {(e["seed"], e["arm"]) for e in episodes}
        return episodes, done

    def decided(episodes, done) -> bool:
        if sprt is None:
            return False
        outcome = {(e["seed"], e["arm"]): e["success"] for e in episodes}
        test = PairedSprt(sprt.effect, sprt.alpha, sprt.beta)
        for seed in completed_pairs(done, plan):
            test.add(outcome[seed, "a"], outcome[seed, "b"])
        return test.decision is not None

    def append(line: dict) -> None:
        with interrupt_deferred(), log.open("a") as f:
            f.write(json.dumps(line) + "\n")
        lines.append(line)

    episodes, done = state()
    bar = tqdm(total=len(plan), initial=len(done), desc=f"ab {task}", unit="ep",
               disable=not progress or arms.operator)  # fmt: skip
    stopped_early = False
    last: tuple[int, str] | None = None
    try:
        while (item := next_episode(plan, done)) is not None:
            if decided(episodes, done):
                stopped_early = True
                break
            seed, arm = item
            if arms.arm != arm:  # one stack at a time: the idle arm must not load the host
                arms.open(arm)
            kind, value, jerk = arms.episode(seed)
            if kind == "stop":
                break
            if kind == "record":
                append({"arm": arm, **asdict(value), "jerk_rms": jerk})
                last = (seed, arm)
            elif kind == "aborted":
                append({"event": "aborted", "seed": seed, "arm": arm, "reason": value})
            elif kind == "discard_last" and last is not None:
                append({"event": "discard", "seed": last[0], "arm": last[1], "reason": value})
                last = None
            episodes, done = state()
            bar.n = len(done)
            bar.refresh()
    finally:
        bar.close()
        arms.close()
    return state()[0], stopped_early


def commanded_jerk(harness, t0: float, duration_s: float) -> float | None:
    """RMS jerk of the commanded arm positions during [t0, t0 + duration_s]."""
    commands = [(t, q) for kind, t, q in harness.motion
                if kind == "command" and t0 <= t <= t0 + duration_s]  # fmt: skip
    return rms_jerk([t for t, _ in commands], [q for _, q in commands]) if commands else None


def ab_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.sim and args.robot not in SIMULATED_ROBOTS:
        parser.error(f"--robot {args.robot} --sim: the simulated workcell has "
                     f"{', '.join(SIMULATED_ROBOTS)} only")  # fmt: skip
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    args.ckpt = args.ckpt or str(shipped_checkpoint(args.robot))
    if not os.path.isdir(args.ckpt):
        parser.error(f"--ckpt {args.ckpt}: no such checkpoint directory")
    try:
        trained_for = load_spec(args.ckpt).robot or "fr3"  # older checkpoints: FR3 only
    except PolicyError as exc:
        parser.error(f"--ckpt {args.ckpt}: not a usable checkpoint ({exc})")
    if trained_for != args.robot:
        parser.error(f"--ckpt {args.ckpt} was trained for {trained_for}, not {args.robot}")
    spec_a = parse_engine_spec(args.a, coerce_scalar)
    spec_b = parse_engine_spec(args.b, coerce_scalar)
    if spec_a == spec_b:
        parser.error("--a and --b are the same engine: nothing to compare")
    sprt = PairedSprt(args.effect, args.alpha, args.beta) if args.sequential else None
    base = {"checkpoint": os.path.abspath(args.ckpt), "stream_mode": "async",
            "image_size": checkpoint_image_size(args.ckpt)}  # fmt: skip
    for item in args.set:
        name, sep, value = item.partition(":=")
        if not sep or not name:
            parser.error(f"--set {item!r}: expected NAME:=VALUE")
        base[name] = coerce_scalar(value)
    stacks = arm_stacks(spec_a, spec_b, args.task, base, args.robot, args.sim)
    out = Path(args.out or f"runs/ab_{args.task}")
    log = out / LOG
    settings = {"task": args.task, "a": spec_a, "b": spec_b, "seed": args.seed,
                "episodes": args.episodes, "order": args.order, "checkpoint": base["checkpoint"],
                "sequential": args.sequential, "robot": args.robot, "sim": args.sim,
                "stack_arguments": args.set}  # fmt: skip
    settings_file = out / "settings.json"
    if args.resume and settings_file.exists():
        previous = json.loads(settings_file.read_text())
        if previous != settings:
            parser.error(f"--resume: {out} holds a run with other settings ({previous})")
    elif log.exists() and not args.resume:
        parser.error(f"{log} exists: --resume to continue it, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    settings_file.write_text(json.dumps(settings, indent=2))
    plan = episode_order(args.episodes, args.seed, args.order)
    try:
        recording = StackRecording(out)
        arms = (SimulatedArms(stacks, args.task, recording) if args.sim
                else OperatorArms(stacks, args.task, settings, recording))  # fmt: skip
        entries, stopped_early = run_ab(arms, args.task, plan, log, sprt, not args.no_progress)
    except KeyboardInterrupt:
        print(f"vla-runtime ab: interrupted; {log} keeps every finished episode (--resume)",
              file=sys.stderr)  # fmt: skip
        return 130
    except (stack_eval.StackDied, stack_eval.StackStalled) as exc:
        print(f"vla-runtime ab: the stack failed: {str(exc).splitlines()[0][:600]}; {log} keeps "
              "every finished episode (--resume)", file=sys.stderr)  # fmt: skip
        return 1
    summary = summarise_ab(entries, plan, settings, sprt, stopped_early, out)
    print(json.dumps(summary, indent=None if args.json else 2))
    print(f"vla-runtime ab: {summary['verdict']}", file=sys.stderr)
    return 0
