"""`vla-runtime eval`: closed-loop episodes of a checkpoint on a task; success rate, time to
completion and runtime metrics as one JSON object.

The options live here, apart from the evaluation (data/evaluate.py), so that `--help` answers
without loading torch, MuJoCo's renderer and rclpy.
"""

from __future__ import annotations

from vla_runtime.core.help_text import SERVO_FEEDFORWARD_OPTION, CommandParser, help_summary
from vla_runtime.core.robot import SIMULATED_ROBOTS
from vla_runtime.sim.tasks import TASKS

EVAL_SEED = 90000  # seeds from here on are never used for training (`collect` refuses them)
DEFAULT_EXECUTE = 8  # actions of each 16-action chunk executed before the next inference


def build_parser() -> CommandParser:
    parser = CommandParser(prog="vla-runtime eval", description=help_summary(__doc__))
    parser.add_argument("--ckpt", help="checkpoint directory (default: the one shipped for the "
                        "robot and its servo)")  # fmt: skip
    parser.add_argument("--robot", choices=SIMULATED_ROBOTS,
                        help="the simulated arm (default: the checkpoint's)")  # fmt: skip
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--seed", type=int, default=EVAL_SEED, help="first episode seed")
    parser.add_argument("--via", choices=("stack", "jtc", "inprocess"), default="stack")
    stack = parser.add_argument_group("stack (the product path)")
    stack.add_argument("--mode", choices=("async", "sync"), default="async",
                       help="streamer mode (sync: the wait-then-execute baseline)")  # fmt: skip
    stack.add_argument("--backend", help="engine back end (default: the stack's)")
    stack.add_argument("--scheduler", action="store_true", help="phase-adaptive scheduler on")
    stack.add_argument("--set", action="append", default=[], metavar="NAME:=VALUE",
                       help="any other sim stack argument (repeatable)")  # fmt: skip
    stack.add_argument("--out", help="per-episode JSONL (default runs/eval_<task>.jsonl)")
    stack.add_argument("--resume", action="store_true", help="skip seeds already in --out")
    stack.add_argument("--plot", help="PNG of commanded vs measured joints and verdicts")
    stack.add_argument("--report", metavar="DIR",
                       help="plots (latency, outcomes, joints) and an HTML page")  # fmt: skip
    stack.add_argument("--quiet", action="store_true", help="no per-episode lines")
    stack.add_argument(
        "--trajectories", metavar="DIR",
        help="one file per episode of the arm's path, for `collect --replay`",
    )  # fmt: skip
    lockstep = parser.add_argument_group("jtc / inprocess (ablations)")
    lockstep.add_argument("--execute", type=int, default=DEFAULT_EXECUTE, help="actions per chunk")
    lockstep.add_argument(
        "--realtime", action="store_true", help="jtc: real-time sim instead of lock-step"
    )
    lockstep.add_argument(
        "--delay-steps", type=int, default=0,
        help="inprocess: each chunk runs this many control steps after its frame, the previous "
        "one running on meanwhile, as the stack's inference and command delay make it run",
    )  # fmt: skip
    parser.add_argument(
        "--noise-scale",
        type=float,
        help="flow start noise (0: deterministic; default: the checkpoint's, else 1)",
    )
    parser.add_argument("--servo-feedforward", **SERVO_FEEDFORWARD_OPTION)
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    parser.add_argument("--no-progress", action="store_true")
    return parser
