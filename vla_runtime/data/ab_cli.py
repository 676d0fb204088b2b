"""`vla-runtime ab`: does the faster way to run a policy cost success or smoothness? Two engine
specs (A and B), the same checkpoint, the same full stack, paired episodes.

The options live here, apart from the runs (data/ab.py), so that `--help` answers without
loading torch, MuJoCo's renderer and rclpy.
"""

from __future__ import annotations

from vla_runtime.core.ab_plan import ORDERS
from vla_runtime.core.help_text import CommandParser, help_summary
from vla_runtime.data.eval_cli import EVAL_SEED
from vla_runtime.sim.tasks import TASKS

REAL_STACKS = {"fr3": ("franka", {"robot_type": "fr3"}), "panda": ("franka", {"robot_type": "fer"}),
               "ur5e": ("ur", {"ur_type": "ur5e"})}  # fmt: skip


def build_parser() -> CommandParser:
    parser = CommandParser(prog="vla-runtime ab", description=help_summary(__doc__))
    parser.add_argument("--a", required=True, metavar="SPEC",
                        help="arm A's engine: name=value[,name=value] stack arguments")  # fmt: skip
    parser.add_argument("--b", required=True, metavar="SPEC", help="arm B's engine")
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--robot", default="fr3", choices=sorted(REAL_STACKS),
                        help="the arm (simulated: fr3, ur5e)")  # fmt: skip
    parser.add_argument("--sim", action="store_true",
                        help="the simulated workcell; without it, the robot's real stack with "
                        "operator-driven episodes (keys on stdin)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="NAME:=VALUE",
                        help="stack argument of both arms, e.g. robot_ip:=172.16.0.2")  # fmt: skip
    parser.add_argument("--episodes", type=int, default=20, help="episodes per arm (pairs)")
    parser.add_argument("--seed", type=int, default=EVAL_SEED, help="first scene seed")
    parser.add_argument("--order", choices=ORDERS, default="abba")
    parser.add_argument("--ckpt", help="checkpoint directory (default: the robot's shipped one)")
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
