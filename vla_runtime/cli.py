"""`vla-runtime`: the single command-line entry point (docs/design.md §8).

Each subcommand's module is imported only when it runs (`_entry`): `--help` and a quick
`launch` need not load torch, MuJoCo and rclpy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from vla_runtime.core.help_text import (
    FAULTS_PLOT_OPTION,
    SERVO_FEEDFORWARD_OPTION,
    CommandParser,
)
from vla_runtime.core.policy_checkpoint import LOCAL_BACKENDS
from vla_runtime.stack.resolver import StackError, coerce_scalar, load_stack_file, resolve_stack


def _entry(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def _launch(args: argparse.Namespace) -> int:
    launcher = importlib.import_module("vla_runtime.stack.launcher")
    overrides = {}
    for item in args.arguments:
        if ":=" not in item:
            print(f"launch arguments are name:=value, got {item!r}", file=sys.stderr)
            return 2
        key, value = item.split(":=", 1)
        overrides[key] = coerce_scalar(value)
    try:
        if args.sim:
            _, raw = load_stack_file(args.stack)
            if "use_sim" in (raw.get("arguments") or {}):
                overrides["use_sim"] = True
        stack = resolve_stack(args.stack, overrides)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    notes: list[str] = list(stack.notes)  # the stack's own (e.g. arguments accepted as no-ops)
    engine = next((n for n in stack.nodes if n.name == "engine"), None)
    if engine is not None and engine.parameters.get("backend") in LOCAL_BACKENDS:
        if not engine.parameters.get("checkpoint"):
            if not any(n.name == "sim_driver" for n in stack.nodes):
                print("error: policy:=true without checkpoint:=DIR would drive a real arm with "
                      "random weights; refused", file=sys.stderr)  # fmt: skip
                return 2
            notes.append("warning: policy:=true without checkpoint:=DIR runs random weights; "
                         "the arm will not do the task")  # fmt: skip
    domain_id = args.domain_id if args.domain_id is not None else launcher.default_domain_request()
    result = launcher.run_stack(
        stack,
        duration_s=args.duration,
        domain_id=domain_id,
        localhost_only=not args.any_host,
        echo=not args.quiet,
        notes=notes,
    )
    print(launcher.format_summary(result.report), flush=True)
    if args.report:
        launcher.write_report(result.report, args.report)
        print(f"report written to {args.report}")
    return result.exit_code


def _bench(args: argparse.Namespace) -> int:
    progress = not args.no_progress  # the bar goes to stderr: stdout is the JSON alone

    def run(module: str, **kwargs):
        return _entry(f"vla_runtime.bench.{module}", "run_bench")(**kwargs, progress=progress)

    if args.name == "sim":
        result = run("sim", seconds=args.seconds or 5.0)
    elif args.name == "engine":
        result = run("engine", preset=args.preset, device=args.device)
    elif args.name == "transport":
        result = run("transport", curve=args.curve, fleet=not args.no_fleet)
    elif args.name == "driver":
        result = run("driver", seconds=args.seconds or 60.0)
    elif args.name == "faults":
        faults = _entry("vla_runtime.bench.faults", "fault_names")(args.faults, args.quick)
        if isinstance(faults, str):
            print(f"vla-runtime bench faults: error: {faults}", file=sys.stderr)
            return 2
        result = run("faults", faults=faults, robot=args.robot,
                     command_interface=args.command_interface,
                     servo_feedforward=args.servo_feedforward,
                     plot_path=Path(args.plot) if args.plot else None)  # fmt: skip
    elif args.name == "safety":
        result = run("safety", quick=args.quick, seed=args.seed or 0)
    elif args.name == "scheduler":
        tasks = _entry("vla_runtime.bench.scheduler", "TASKS")
        if any(t not in tasks for t in args.tasks or ()) or (args.episodes or 1) < 1:
            print(f"vla-runtime bench scheduler: error: --tasks from {list(tasks)}, --episodes "
                  ">= 1", file=sys.stderr)  # fmt: skip
            return 2
        result = run(
            "scheduler",
            checkpoint=args.ckpt,
            tasks=tuple(args.tasks or tasks),
            episodes=args.episodes or 50,
            seed=args.seed,
            config=args.config,
            out=args.out or "runs/bench_scheduler",
            resume=args.resume,
            projection_preset=args.project_onto,
        )
    elif args.name == "closed-loop":
        closed_loop = importlib.import_module("vla_runtime.bench.closed_loop")
        delays = tuple(args.delays or closed_loop.DELAYS)
        bad_episodes = args.episodes is not None and args.episodes < 1
        if bad_episodes or any(d not in closed_loop.DELAYS for d in delays):
            print(f"error: --delays from {list(closed_loop.DELAYS)}, --episodes >= 1",
                  file=sys.stderr)  # fmt: skip
            return 2
        result = closed_loop.run_bench(
            checkpoint=args.ckpt,
            tasks=tuple(args.tasks or closed_loop.TASKS),
            episodes=args.episodes or 10,
            seed=args.seed if args.seed is not None else 90000,
            out=args.out or "runs/closed_loop",
            delays=delays,
            progress=progress,
        )
    elif args.name == "streamer":
        result = run("streamer", seconds=args.seconds or 3.0)
    else:  # argparse restricts choices; kept for clarity
        raise SystemExit(f"unknown benchmark {args.name}")
    text = json.dumps(result, indent=None if args.json else 2, sort_keys=True)
    print(text)
    return 0


DATA_COMMANDS = {
    "collect": ("vla_runtime.data.collect", "collect_main"),
    "record": ("vla_runtime.data.record", "record_main"),
    "train": ("vla_runtime.data.train_cli", "train_main"),
    "eval": ("vla_runtime.data.evaluate", "eval_main"),
    "ab": ("vla_runtime.data.ab", "ab_main"),
    "serve": ("vla_runtime.engine.remote.serve_cli", "serve_main"),
    "export": ("vla_runtime.engine.build_cli", "export_main"),
    "build-engine": ("vla_runtime.engine.build_cli", "build_engine_main"),
    "describe": ("vla_runtime.sim.description", "describe_main"),
}
# Commands whose options are declared apart from their heavy imports: --help answers at once.
LIGHT_PARSERS = {"eval": "vla_runtime.data.eval_cli", "ab": "vla_runtime.data.ab_cli"}
BENCH_OPTIONS = {
    "seconds": (["--seconds"], {"type": float, "help": "run length (s)"}),
    "preset": (["--preset"], {"default": "tiny", "help": "model preset (tiny, small)"}),
    "device": (["--device"], {"default": "cpu", "help": "cpu or cuda[:N]"}),
    "ckpt": (["--ckpt"], {"help": "policy checkpoint directory (default: the shipped one)"}),
    "tasks": (["--tasks"], {"nargs": "+", "help": "tasks (default: all four)"}),
    "episodes": (["--episodes"], {"type": int, "help": "episodes per task and arm"}),
    "delays": (["--delays"], {"nargs": "+", "help": "injected delays (0 100 200 300 heavy)"}),
    "out": (["--out"], {"help": "folder for the episode logs and the plot"}),
    "seed": (["--seed"], {"type": int, "help": "first evaluation seed"}),
    "project_onto": (["--project-onto"], {"default": "small", "choices": ["tiny", "small"],
                                          "help": "model preset the scheduled mode mix is timed "
                                                  "on (default small)"}),
    "config": (["--config"], {"help": "thresholds YAML (default config/scheduler.yaml)"}),
    "curve": (["--curve"], {"action": "store_true", "help": "also ZeroMQ with CURVE"}),
    "no_fleet": (["--no-fleet"], {"action": "store_true", "help": "skip Ray Serve"}),
    "resume": (["--resume"], {"action": "store_true",
                              "help": "skip the episodes already in --out"}),
    "quick": (["--quick"], {"action": "store_true", "help": "a short run (tests)"}),
    # core.robot.SIMULATED_ROBOTS, named here so that the CLI starts without numpy
    "robot": (["--robot"], {"choices": ["fr3", "ur5e"], "default": "fr3",
                            "help": "simulated arm"}),
    "command_interface": (["--command-interface"],
                          {"choices": ["trajectory", "forward_position"], "default": "trajectory",
                           "help": "the interface the gate drives"}),
    "faults": (["--faults"], {"help": "comma-separated fault names (default: all)"}),
    "servo_feedforward": (["--servo-feedforward"], SERVO_FEEDFORWARD_OPTION),
    "plot": (["--plot"], FAULTS_PLOT_OPTION),
}  # fmt: skip
# name -> (what it measures, its options)
BENCHMARKS = {
    "sim": ("physics real-time factor and render time per camera (default 5 s)", ["seconds"]),
    "engine": ("latency, memory and reuse speedups per back end and compute mode",
               ["preset", "device"]),
    "transport": ("serving overhead per path (ZeroMQ, openpi, Ray Serve) and Ray batching "
                  "throughput", ["curve", "no_fleet"]),
    "streamer": ("control-loop jitter, tick cost, sync vs async with injected delays (default "
                 "3 s)", ["seconds"]),
    "driver": ("franky driver against franky-sim: latency, jitter, libfranka errors (default "
               "60 s)", ["seconds"]),
    "faults": ("every injected fault: detection and stop times, unsafe commands, lost chunks",
               ["quick", "faults", "robot", "command_interface", "servo_feedforward", "plot"]),
    "safety": ("chunk check + consequence rollout against full-physics ground truth: hazard "
               "recall, false vetoes, check time", ["quick", "seed"]),
    "scheduler": ("scheduled vs full compute on the shipped policy through the product path in "
                  "real time (default 50 episodes per task), projected onto a bigger "
                  "model", ["ckpt", "tasks", "episodes", "seed", "config", "out", "resume",
                             "project_onto"]),
    "closed-loop": ("success and time to success under injected delays, async vs sync (default "
                    "10 episodes)", ["ckpt", "tasks", "episodes", "delays", "out", "seed"]),
}  # fmt: skip


def _recover(args: argparse.Namespace) -> int:
    if not args.reason.strip():
        print("vla-runtime recover: error: --reason must say why (it is logged with the reset)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.domain is not None and not 0 <= args.domain <= 232 or not args.timeout > 0:
        print(f"vla-runtime recover: error: --domain in 0..232 and --timeout > 0, got "
              f"{args.domain} and {args.timeout}", file=sys.stderr)  # fmt: skip
        return 2
    recover = _entry("vla_runtime.ros.operator_recover", "recover_main")
    return recover(args.reason, args.domain, args.timeout)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="vla-runtime", description=__doc__)
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
    benchmarks = bench.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, (description, options) in BENCHMARKS.items():
        one = benchmarks.add_parser(name, help=description, description=description)
        one.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
        one.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
        for option in options:
            flags, kwargs = BENCH_OPTIONS[option]
            one.add_argument(*flags, **kwargs)
        one.set_defaults(func=_bench)

    for name, (module, _) in DATA_COMMANDS.items():
        sub.add_parser(name, help=f"see `vla-runtime {name} --help` ({module})", add_help=False)
    sub.add_parser(
        "calibrate",
        help="`calibrate intrinsics|hand-eye|latency [--sim]`: cameras and timing "
        "(calibration/); `calibrate scheduler --data DIR`: scheduler thresholds",
        add_help=False,
    )
    recover = sub.add_parser(
        "recover", help="after a stop: recover the driver and reset the safety gate's latch",
        description="Publish the reason on /vla/operator/reason, call /vla/driver/recover (when "
        "a driver serves it), then /vla/estop/reset. Exits 1 if a step is refused.",
    )  # fmt: skip
    recover.add_argument("--reason", required=True, help="why; logged with the reset")
    recover.add_argument("--domain", "--domain-id", type=int, metavar="N",
                         help="the stack's ROS_DOMAIN_ID (default: this shell's)")  # fmt: skip
    recover.add_argument("--timeout", type=float, default=10.0, metavar="S",
                         help="s to wait for the services (default 10)")  # fmt: skip
    recover.set_defaults(func=_recover)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _dispatch(argv)
    except (ValueError, OSError, RuntimeError) as exc:
        # One line: bad input (a path, a seed, a device, a dataset, a checkpoint) exits 2, a run
        # that could not be made (a stack that did not start, a node that died) exits 1.
        if os.environ.get("VLA_RUNTIME_TRACEBACK"):
            raise
        bad_input = isinstance(exc, ValueError | OSError)
        command = " ".join(argv[:2] if argv[:1] in (["bench"], ["calibrate"]) else argv[:1])
        line = (str(exc).splitlines() or [type(exc).__name__])[0]
        print(f"vla-runtime {command}: {'error' if bad_input else 'failed'}: {line} "
              "(VLA_RUNTIME_TRACEBACK=1 for the traceback)", file=sys.stderr)  # fmt: skip
        return 2 if bad_input else 1


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in DATA_COMMANDS:  # argparse lives in the commands' modules
        if argv[0] in LIGHT_PARSERS and {"-h", "--help"} & set(argv[1:]):
            _entry(LIGHT_PARSERS[argv[0]], "build_parser")().parse_args(argv[1:])  # exits
        return _entry(*DATA_COMMANDS[argv[0]])(argv[1:])
    if argv[:2] == ["calibrate", "scheduler"]:
        return _entry("vla_runtime.data.calibrate_scheduler", "calibrate_main")(argv[2:])
    if argv[:1] == ["calibrate"]:
        if len(argv) == 1:
            print("usage: vla-runtime calibrate {intrinsics,hand-eye,latency,scheduler} ... "
                  "(vla-runtime calibrate --help)", file=sys.stderr)  # fmt: skip
            return 2
        return _entry("vla_runtime.data.calibrate", "calibrate_main")(argv[1:])
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
