"""The gripper's unit: inside the runtime, one finger's opening in m.

Chunks, /joint_states and /vla/command carry the gripper as one finger's opening, the unit
franka's JointTrajectoryController uses (core/topics.py). Robot configs (`gripper.max_width`,
`gripper.max_speed`), gripper controller commands (`/<gripper controller>/commands`) and the
vendors' gripper calls (franka_gripper, franky, libfranka) speak of the width between the two
fingers. Every conversion between the two goes through this module.
"""

from __future__ import annotations

import math
from collections.abc import Sized

from vla_runtime.core.robot import RobotConfig

FINGERS = 2  # a parallel gripper: its width is the sum of both fingers' openings


def opening_from_width(width):
    """One finger's opening (m) for a gripper width (m); floats or numpy arrays."""
    return width / FINGERS


def width_from_opening(opening):
    """The gripper width (m) for one finger's opening (m); floats or numpy arrays."""
    return opening * FINGERS


def max_opening(robot: RobotConfig) -> float:
    """How far one finger opens (m): the chunk column's upper limit."""
    return opening_from_width(robot.gripper_max_width)


def max_finger_speed(robot: RobotConfig) -> float:
    """How fast one finger moves (m/s) at the gripper's maximum width speed."""
    return opening_from_width(robot.gripper_max_speed)


def finger_toward(current: float, goal: float, max_step: float) -> float:
    """One control step of a hand's own controller: the finger opening moved from `current`
    toward `goal` by at most `max_step`."""
    return current + min(max_step, max(-max_step, goal - current))


def width_refusal(width: float, max_width: float) -> str | None:
    """Why a commanded gripper width (m) cannot be executed, or None when it can."""
    if not math.isfinite(width):
        return f"gripper width {width!r} is not a finite number"
    if not 0.0 <= width <= max_width:
        return f"gripper width {width} outside [0, {max_width}]"
    return None


def command_refusal(values: Sized) -> str | None:
    """Why a gripper controller command (std_msgs/Float64MultiArray data: one width, m) is
    malformed, or None when it carries one value."""
    if len(values) != 1:
        return f"gripper command needs exactly 1 value (width in m), got {len(values)}"
    return None
