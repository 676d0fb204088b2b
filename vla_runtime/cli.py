"""`vla-runtime`: the single command-line entry point (DESIGN.md §8)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys


def _launch(args: argparse.Namespace) -> int:
    from vla_runtime.core.stack import StackError, coerce_scalar, resolve_stack
    from vla_runtime.launcher import default_domain_request, format_summary, run_stack, write_report

    overrides = {}
    for item in args.arguments:
        if ":=" not in item:
            print(f"launch arguments are name:=value, got {item!r}", file=sys.stderr)
            return 2
        key, value = item.split(":=", 1)
        overrides[key] = coerce_scalar(value)
    try:
        if args.sim:
            from vla_runtime.core.stack import load_stack_file

            _, raw = load_stack_file(args.stack)
            if "use_sim" in (raw.get("arguments") or {}):
                overrides["use_sim"] = True
        stack = resolve_stack(args.stack, overrides)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    notes: list[str] = []
    engine = next((n for n in stack.nodes if n.name == "engine"), None)
    if engine is not None and engine.parameters.get("backend") != "remote":
        if not engine.parameters.get("checkpoint"):
            if not any(n.name == "sim_driver" for n in stack.nodes):
                print("error: policy:=true without checkpoint:=DIR would drive a real arm with "
                      "random weights; refused", file=sys.stderr)  # fmt: skip
                return 2
            notes.append("warning: policy:=true without checkpoint:=DIR runs random weights; "
                         "the arm will not do the task")  # fmt: skip
    result = run_stack(
        stack,
        duration_s=args.duration,
        domain_id=args.domain_id if args.domain_id is not None else default_domain_request(),
        localhost_only=not args.any_host,
        echo=not args.quiet,
        notes=notes,
    )
    print(format_summary(result.report), flush=True)
    if args.report:
        write_report(result.report, args.report)
        print(f"report written to {args.report}")
    return result.exit_code


def _bench(args: argparse.Namespace) -> int:
    if args.name == "sim":
        from vla_runtime.bench.sim import run_bench

        result = run_bench(seconds=args.seconds or 5.0)
    elif args.name == "engine":
        from vla_runtime.bench.engine import run_bench

        result = run_bench(preset=args.preset, device=args.device)
    elif args.name == "transport":
        from vla_runtime.bench.transport import run_bench

        result = run_bench()
    elif args.name == "driver":
        from vla_runtime.bench.driver import run_bench

        result = run_bench(seconds=args.seconds or 60.0)
    elif args.name == "faults":
        from vla_runtime.bench.faults import run_bench

        result = run_bench()
    elif args.name == "scheduler":
        from vla_runtime.bench.scheduler import run_bench

        result = run_bench(
            checkpoint=args.ckpt,
            tasks=tuple(args.tasks or ("reach", "push", "pick", "dynamic_reach")),
            episodes=args.episodes or 50,
            seed=args.seed,
            execute=args.execute,
            config=args.config,
        )
    elif args.name == "closed-loop":
        from vla_runtime.bench.closed_loop import DELAYS, TASKS
        from vla_runtime.bench.closed_loop import run_bench as closed_loop

        delays = tuple(args.delays or DELAYS)
        bad_episodes = args.episodes is not None and args.episodes < 1
        if bad_episodes or any(d not in DELAYS for d in delays):
            print(f"error: --delays from {list(DELAYS)}, --episodes >= 1", file=sys.stderr)
            return 2
        result = closed_loop(
            checkpoint=args.ckpt,
            tasks=tuple(args.tasks or TASKS),
            episodes=args.episodes or 10,
            seed=args.seed if args.seed is not None else 90000,
            out=args.out or "runs/closed_loop",
            delays=delays,
        )
    elif args.name == "streamer":
        from vla_runtime.bench.streamer import run_bench

        result = run_bench(seconds=args.seconds or 3.0)
    else:  # argparse restricts choices; kept for clarity
        raise SystemExit(f"unknown benchmark {args.name}")
    text = json.dumps(result, indent=None if args.json else 2, sort_keys=True)
    print(text)
    return 0


def _serve(argv: list[str]) -> int:
    from vla_runtime.engine.remote import serve_main

    return serve_main(argv)


DATA_COMMANDS = {
    "collect": ("vla_runtime.data.collect", "collect_main"),
    "record": ("vla_runtime.data.record", "record_main"),
    "train": ("vla_runtime.data.train", "train_main"),
    "eval": ("vla_runtime.data.evaluate", "eval_main"),
}
BENCHMARKS = [
    "sim", "engine", "transport", "streamer", "driver", "faults", "scheduler", "closed-loop",
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla-runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    launch = sub.add_parser("launch", help="start a stack (config/stacks/STACK.yaml)")
    launch.add_argument("stack", help="stack name (sim, franka, ur) or path to a stack file")
    launch.add_argument("arguments", nargs="*", help="stack arguments as name:=value")
    launch.add_argument("--sim", action="store_true", help="simulate arm and cameras (use_sim)")
    launch.add_argument("--duration", type=float, help="stop after S seconds of stack time")
    launch.add_argument("--report", help="write the run report (JSON) here")
    launch.add_argument(
        "--domain-id", type=int, help="use this ROS_DOMAIN_ID instead of a free one"
    )
    launch.add_argument(
        "--any-host", action="store_true", help="do not restrict DDS discovery to this host"
    )
    launch.add_argument("--quiet", action="store_true", help="do not echo node output")
    launch.set_defaults(func=_launch)

    bench = sub.add_parser("bench", help="run a benchmark; prints one JSON object")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    bench.add_argument(
        "--seconds", type=float, help="run length (sim, streamer: default 5; driver: 60)"
    )
    bench.add_argument("--preset", default="tiny", help="engine: model preset (tiny, small)")
    bench.add_argument("--device", default="cpu", help="engine: cpu or cuda")
    bench.add_argument("--ckpt", help="scheduler: policy checkpoint directory")
    bench.add_argument(
        "--tasks", nargs="+", help="scheduler (default: all four), closed-loop (dynamic_reach pick)"
    )
    bench.add_argument(
        "--episodes", type=int, help="episodes per task (scheduler: 50, closed-loop: 10)"
    )
    bench.add_argument(
        "--delays", nargs="+", help="closed-loop: injected delays (0 100 200 300 heavy)"
    )
    bench.add_argument("--out", help="closed-loop: folder for the episode logs and the plot")
    bench.add_argument("--seed", type=int, help="scheduler, closed-loop: first evaluation seed")
    bench.add_argument("--execute", type=int, help="scheduler: actions executed per chunk")
    bench.add_argument(
        "--config", help="scheduler: thresholds YAML (default config/scheduler.yaml)"
    )
    bench.set_defaults(func=_bench)

    sub.add_parser("serve", help="serve a policy over ZeroMQ (see `serve --help`)", add_help=False)
    for name, (module, _) in DATA_COMMANDS.items():
        sub.add_parser(name, help=f"see `vla-runtime {name} --help` ({module})", add_help=False)
    sub.add_parser("calibrate", help="`calibrate scheduler --data DIR`: fit thresholds")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        return _serve(argv[1:])
    if argv and argv[0] in DATA_COMMANDS:  # argparse lives in the data modules
        module, function = DATA_COMMANDS[argv[0]]
        return getattr(importlib.import_module(module), function)(argv[1:])
    if argv[:2] == ["calibrate", "scheduler"]:
        from vla_runtime.data.calibrate_scheduler import calibrate_main

        return calibrate_main(argv[2:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Stack arguments (name:=value) may come after options: `launch sim --duration 5 seed:=3`.
    if args.command == "launch":
        args.arguments += [e for e in extra if not e.startswith("-")]
        extra = [e for e in extra if e.startswith("-")]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
