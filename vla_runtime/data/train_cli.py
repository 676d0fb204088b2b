"""`vla-runtime train`: flow-matching training of the reference VLA on LeRobot v3 datasets.

The options are parsed before torch is imported, so `--help` and a bad option answer at once;
the training itself is data/train.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys

from vla_runtime.core.help_text import CommandParser, help_summary
from vla_runtime.engine.policy import ActionSpace


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="vla-runtime train", description=help_summary(__doc__))
    parser.add_argument("--data", action="append", required=True, help="dataset dir (repeatable)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--out", required=True, help="checkpoint directory (resumed if present)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--include-failed", action="store_true", help="train on failed too")
    parser.add_argument(
        "--state-noise", type=float, default=0.0, help="std (rad) added to arm joint states"
    )
    parser.add_argument(
        "--aux-weight",
        type=float,
        default=1.0,
        help="weight of the privileged-state auxiliary loss (datasets with env state; 0: off)",
    )
    parser.add_argument(
        "--action-space",
        choices=[ActionSpace.JOINT_POSITIONS.value, ActionSpace.JOINT_DELTAS.value],
        default=ActionSpace.JOINT_POSITIONS.value,
        help="arm actions as absolute joint positions or deltas from the measured state",
    )
    parser.add_argument("--init", help="start from this checkpoint's weights (fine-tune)")
    parser.add_argument(
        "--earlier-frame",
        action="append",
        default=[],
        metavar="CAMERA:SECONDS",
        type=earlier_frame,
        help="the policy also sees CAMERA's frame SECONDS earlier (as camera CAMERA_earlier), "
        "so that it sees motion; repeatable",
    )
    parser.add_argument("--ship", help="also write a compact float16 copy here")
    parser.add_argument(
        "--noise-scale",
        type=float,
        help="flow start noise the checkpoint recommends at run time (0: deterministic)",
    )
    parser.add_argument("--no-progress", action="store_true")
    return parser


def earlier_frame(text: str) -> tuple[str, float]:
    camera, _, seconds = text.partition(":")
    try:
        delay = float(seconds)
    except ValueError:
        delay = math.nan
    if not camera or not 0.0 < delay <= 1.0:
        raise argparse.ArgumentTypeError(f"CAMERA:SECONDS with 0 < SECONDS <= 1, not {text!r}")
    return camera, delay


def train_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.noise_scale is not None and not 0.0 <= args.noise_scale <= 1.0:
        parser.error(f"--noise-scale must be in [0, 1], got {args.noise_scale}")
    training = importlib.import_module("vla_runtime.data.train")
    command = "vla-runtime train " + " ".join(sys.argv[1:] if argv is None else argv)
    summary = training.train(
        args.data, args.out, args.preset, args.steps, args.batch_size, args.lr, args.seed,
        args.save_every, args.include_failed, args.threads, not args.no_progress, command,
        args.state_noise, args.aux_weight, args.action_space, args.init,
        None if args.noise_scale is None else {"noise_scale": args.noise_scale},
        dict(args.earlier_frame),
    )  # fmt: skip
    complete = summary["completed_steps"] == args.steps
    if args.ship and complete:
        summary["shipped"] = str(training.export_compact(args.out, args.ship))
    print(json.dumps(summary))
    return 0 if complete else 130


if __name__ == "__main__":
    sys.exit(train_main())
