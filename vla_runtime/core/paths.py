"""Where the package's data (config/, launch/) lives: the source tree, a pip install
(`<prefix>/share/vla_runtime`) or a colcon install (ament share directory)."""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path

PACKAGE = "vla_runtime"


@cache
def share_dir() -> Path:
    """The directory that holds config/ and launch/ (override with VLA_RUNTIME_SHARE)."""
    override = os.environ.get("VLA_RUNTIME_SHARE")
    if override:
        return Path(override)
    source_tree = Path(__file__).resolve().parents[2]
    if (source_tree / "config" / "stacks").is_dir():
        return source_tree
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory(PACKAGE))
    except Exception:  # not a colcon install (or ament_index not importable)
        pass
    return Path(sys.prefix) / "share" / PACKAGE


def config_dir() -> Path:
    return share_dir() / "config"


# Whether the simulated arm's servo is fed the setpoint's velocity unless told otherwise, as a
# real arm's joint controller is (sim/simulator.py): the default of every command, function,
# node and stack (`servo_feedforward`) that simulates the arm, and so which shipped policy it
# runs. Off: the FR3 policy for the tracking servo misses a product-path target (docs/safety.md).
SIM_SERVO_FEEDFORWARD = False


def shipped_checkpoint(robot: str = "fr3", servo_feedforward: bool = SIM_SERVO_FEEDFORWARD) -> Path:
    """The trained tiny policy for `robot` and its simulated servo that ships with the package
    (checkpoints/vla_tiny_sim for the FR3, vla_tiny_sim_<robot> for the others; + `_tracking`
    for the servo fed forward: a policy trained on one servo loses success on the other)."""
    name = "vla_tiny_sim" if robot == "fr3" else f"vla_tiny_sim_{robot}"
    return share_dir() / "checkpoints" / (f"{name}_tracking" if servo_feedforward else name)
