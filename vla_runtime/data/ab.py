"""`vla-runtime ab`: does the faster way to run a policy cost success or smoothness? Two engine
specs (A and B), the same checkpoint, the same full stack, paired episodes.

Each pair runs both arms on one scene seed, in an order that removes drift (`--order`:
ABBA by default). Every episode goes through the product path in real time (cameras, engine,
safety, streamer, simulated arm); only the engine's stack arguments differ between the arms.
Episodes stream to OUT/episodes.jsonl as they finish, so Ctrl-C loses nothing and `--resume`
continues where the log ends. With `--sequential`, a paired SPRT stops the run once the
discordant pairs make the answer clear. The summary (JSON on stdout) holds per-arm figures,
the differences with confidence intervals and a one-sentence verdict; OUT/report.html shows
the plots.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from vla_runtime.core.ab_plan import ORDERS, completed_pairs, episode_order, parse_engine_spec
from vla_runtime.core.ab_stats import PairedSprt, rms_jerk
from vla_runtime.core.help_text import help_summary
from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.data import stack_eval
from vla_runtime.data.ab_summary import summarise_ab
from vla_runtime.data.evaluate import EVAL_SEED, checkpoint_image_size
from vla_runtime.sim.tasks import TASKS
from vla_runtime.stack.resolver import StackError, coerce_scalar, resolve_stack

LOG = "episodes.jsonl"


def arm_stacks(spec_a: dict, spec_b: dict, task: str, base: dict) -> dict:
    """The sim stack for each arm; a spec naming something the stack does not take is refused
    here, before any episode runs."""
    stacks = {}
    for arm, spec in (("a", spec_a), ("b", spec_b)):
        try:
            stacks[arm] = resolve_stack("sim", {**base, **spec, "task": task, "policy": True})
        except StackError as exc:
            raise ValueError(f"--{arm} {spec}: {exc}") from None
    return stacks


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_ab(
    stacks: dict, task: str, plan: list, log: Path, sprt: PairedSprt | None, progress: bool
) -> tuple[list[dict], bool]:
    """Run the plan's episodes not yet in `log`; returns every logged episode and whether the
    SPRT stopped the run early."""
    entries = read_log(log)
    done = {(e["seed"], e["arm"]) for e in entries}
    outcome = {(e["seed"], e["arm"]): e["success"] for e in entries}

    def decided() -> bool:
        if sprt is None:
            return False
        test = PairedSprt(sprt.effect, sprt.alpha, sprt.beta)
        for seed in completed_pairs(done, plan):
            test.add(outcome[seed, "a"], outcome[seed, "b"])
        return test.decision is not None

    harness, harness_arm = None, None
    bar = tqdm(total=len(plan), initial=len(done), desc=f"ab {task}", unit="ep",
               disable=not progress)  # fmt: skip
    stopped_early = decided()
    try:
        for seed, arm in plan:
            if stopped_early:
                break
            if (seed, arm) in done:
                continue
            if harness_arm != arm:  # one stack at a time: the idle arm must not load the host
                if harness is not None:
                    harness.close()
                    harness = None
                harness = stack_eval.StackHarness(stacks[arm], record_motion=True)
                harness_arm = arm
                harness.warm_up(task)
            harness.forget_reports()
            try:
                record = stack_eval.run_episode(harness, task, seed)
            except (stack_eval.StackDied, stack_eval.StackStalled) as exc:
                kind = "stack_died" if isinstance(exc, stack_eval.StackDied) else "stalled"
                record = stack_eval.EpisodeRecord(seed, kind, False, None, 0.0, 0.0, str(exc))
                harness.close()
                harness, harness_arm = None, None
            entry = {"arm": arm, **asdict(record), "jerk_rms": _jerk(harness, record)}
            with log.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            entries.append(entry)
            done.add((seed, arm))
            outcome[seed, arm] = record.success
            bar.update(1)
            stopped_early = decided() and len(done) < len(plan)
    finally:
        bar.close()
        if harness is not None:
            harness.close()
    return entries, stopped_early


def _jerk(harness, record) -> float | None:
    """RMS jerk of the commanded arm positions during the episode."""
    if harness is None or not harness.episodes:
        return None
    t0 = float(harness.episodes[-1]["stamp"])
    commands = [(t, q) for kind, t, q in harness.motion
                if kind == "command" and t0 <= t <= t0 + record.sim_s]  # fmt: skip
    return rms_jerk([t for t, _ in commands], [q for _, q in commands]) if commands else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla-runtime ab", description=help_summary(__doc__))
    parser.add_argument("--a", required=True, metavar="SPEC",
                        help="arm A's engine: name=value[,name=value] stack arguments")  # fmt: skip
    parser.add_argument("--b", required=True, metavar="SPEC", help="arm B's engine")
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--robot", default="fr3", choices=("fr3",),
                        help="simulated arm (the shipped policy is for the FR3)")  # fmt: skip
    parser.add_argument("--sim", action="store_true", help="the simulated stack (required)")
    parser.add_argument("--episodes", type=int, default=20, help="episodes per arm (pairs)")
    parser.add_argument("--seed", type=int, default=EVAL_SEED, help="first scene seed")
    parser.add_argument("--order", choices=ORDERS, default="abba")
    parser.add_argument("--ckpt", default=str(shipped_checkpoint()), help="checkpoint directory")
    parser.add_argument("--out", help="folder for the log and the report (default runs/ab_TASK)")
    parser.add_argument("--resume", action="store_true", help="continue the log in --out")
    parser.add_argument("--sequential", action="store_true",
                        help="stop early once a paired SPRT decides")  # fmt: skip
    parser.add_argument("--effect", type=float, default=0.3,
                        help="SPRT: win share over 1/2 of discordant pairs to detect")  # fmt: skip
    parser.add_argument("--alpha", type=float, default=0.05, help="SPRT: false-difference rate")
    parser.add_argument("--beta", type=float, default=0.2, help="SPRT: missed-effect rate")
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def ab_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.sim:
        parser.error("only simulated arms are supported (--sim): operator-driven episodes on a "
                     "real arm are not built yet")  # fmt: skip
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    if not os.path.isdir(args.ckpt):
        parser.error(f"--ckpt {args.ckpt}: no such checkpoint directory")
    spec_a = parse_engine_spec(args.a, coerce_scalar)
    spec_b = parse_engine_spec(args.b, coerce_scalar)
    if spec_a == spec_b:
        parser.error("--a and --b are the same engine: nothing to compare")
    sprt = PairedSprt(args.effect, args.alpha, args.beta) if args.sequential else None
    base = {"checkpoint": os.path.abspath(args.ckpt), "stream_mode": "async",
            "image_size": checkpoint_image_size(args.ckpt)}  # fmt: skip
    stacks = arm_stacks(spec_a, spec_b, args.task, base)
    out = Path(args.out or f"runs/ab_{args.task}")
    log = out / LOG
    settings = {"task": args.task, "a": spec_a, "b": spec_b, "seed": args.seed,
                "episodes": args.episodes, "order": args.order, "checkpoint": base["checkpoint"],
                "sequential": args.sequential}  # fmt: skip
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
        entries, stopped_early = run_ab(stacks, args.task, plan, log, sprt, not args.no_progress)
    except KeyboardInterrupt:
        print(f"vla-runtime ab: interrupted; {log} keeps every finished episode (--resume)",
              file=sys.stderr)  # fmt: skip
        return 130
    summary = summarise_ab(entries, plan, settings, sprt, stopped_early, out)
    print(json.dumps(summary, indent=None if args.json else 2))
    print(f"vla-runtime ab: {summary['verdict']}", file=sys.stderr)
    return 0
