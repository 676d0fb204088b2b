"""`vla-runtime export` and `vla-runtime build-engine`: the ONNX graphs of a checkpoint, and an
engine built from them for one back end, precision and device (engine/built_engine.py;
engines/README.md)."""

from __future__ import annotations

import argparse
import json

from vla_runtime.core.help_text import CommandParser
from vla_runtime.engine.built_engine import (
    ENGINE_BACKENDS,
    ENGINE_PRECISIONS,
    build_engine,
    read_manifest,
)
from vla_runtime.engine.checkpoint import load_checkpoint, random_checkpoint
from vla_runtime.engine.onnx_backend import engine_cache_root, export_onnx


def _add_weights_options(parser: argparse.ArgumentParser) -> None:
    weights = parser.add_mutually_exclusive_group(required=True)
    weights.add_argument(
        "--checkpoint", help="checkpoint directory (model.safetensors + spec.json)"
    )
    weights.add_argument(
        "--preset", help="no checkpoint: random weights of this model preset (tiny, small)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --preset's random weights")


def export_main(argv: list[str]) -> int:
    parser = CommandParser(
        prog="vla-runtime export",
        description="Export a checkpoint's graphs to ONNX (six files and manifest.json, see "
        "vla_runtime/engine/onnx_backend.py) into OUT/onnx-<model hash>/; prints that directory.",
    )
    _add_weights_options(parser)
    parser.add_argument(
        "--out",
        help=f"parent directory (default: the engine cache the back ends read, here "
        f"{engine_cache_root()})",
    )
    args = parser.parse_args(argv)
    if args.checkpoint:
        checkpoint = load_checkpoint(args.checkpoint)
    else:
        checkpoint = random_checkpoint(args.preset, args.seed)
    print(export_onnx(checkpoint, args.out))
    return 0


def build_engine_main(argv: list[str]) -> int:
    parser = CommandParser(
        prog="vla-runtime build-engine",
        description="Build OUT/<checkpoint-name>-<hash>/ for one back end, precision and device, "
        "with manifest.json (file hashes, spec hash, library versions); the engine node loads "
        "it with checkpoint:=OUT/<dir> backend:=BACKEND. Prints the directory.",
    )
    _add_weights_options(parser)
    parser.add_argument("--backend", required=True, choices=ENGINE_BACKENDS)
    parser.add_argument("--precision", default="fp32", choices=ENGINE_PRECISIONS)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    parser.add_argument("--out", default="engines", help="parent directory (default engines)")
    parser.add_argument("--json", action="store_true", help="print the manifest's summary as JSON")
    args = parser.parse_args(argv)
    directory = build_engine(
        args.checkpoint,
        args.backend,
        args.precision,
        args.device,
        args.out,
        preset=args.preset,
        seed=args.seed,
    )
    if args.json:
        manifest = read_manifest(directory)
        keys = ("backend", "precision", "device", "gpu", "versions", "built_at", "checkpoint")
        print(json.dumps({"directory": str(directory), **{k: manifest[k] for k in keys}}))
    else:
        print(directory)
    return 0
