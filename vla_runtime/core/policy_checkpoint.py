"""What a stack takes from its policy's checkpoint (its spec.json), so that `launch ...
policy:=true` runs the policy it names as `eval` does: in simulation the policy shipped for
the robot and its servo when no checkpoint is named, and cameras publishing the image size the
policy was trained on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD, shipped_checkpoint

LOCAL_BACKENDS = ("torch", "onnxruntime", "tensorrt")  # the engine runs a checkpoint itself
POLICY_DEFAULT_REASONS = {
    "checkpoint": "the simulated robot's shipped policy for its servo; checkpoint:=DIR names "
    "another",
    "image_size": "the size the checkpoint's cameras were trained on",
}


def checkpoint_image_size(checkpoint: str | Path) -> int:
    """The square image size the checkpoint's cameras were trained on."""
    spec = json.loads((Path(checkpoint) / "spec.json").read_text())["spec"]
    sizes = {(c["height"], c["width"]) for c in spec["cameras"]}
    if len(sizes) != 1 or len({*next(iter(sizes))}) != 1:
        raise ValueError(f"{checkpoint}: cameras of different or non-square sizes {sizes}")
    return next(iter(sizes))[0]


def policy_arguments(args: dict[str, Any], given: set[str], simulated: bool) -> dict[str, Any]:
    """The stack arguments the checkpoint decides, unless given: with `policy` on and a local
    back end, an empty `checkpoint` in simulation is the one shipped for the robot and its
    servo (`servo_feedforward`; where one ships, random weights otherwise), and `image_size` is
    the checkpoint's. A checkpoint whose spec cannot be read is left for the engine to refuse
    in its own words."""
    if not args.get("policy") or args.get("backend") not in LOCAL_BACKENDS:
        return {}
    decided = {}
    checkpoint = args.get("checkpoint", "")
    if not checkpoint and simulated and "checkpoint" not in given:
        tracking = bool(args.get("servo_feedforward", SIM_SERVO_FEEDFORWARD))
        shipped = shipped_checkpoint(str(args.get("robot", "fr3")), tracking)
        if (shipped / "spec.json").is_file():
            checkpoint = decided["checkpoint"] = str(shipped)
    if checkpoint and "image_size" in args and "image_size" not in given:
        try:
            decided["image_size"] = checkpoint_image_size(checkpoint)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return decided
