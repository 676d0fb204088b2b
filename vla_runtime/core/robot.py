"""Robot descriptions (joint names, limits, home pose, controller names) from config/robots/*.yaml.

The config directory is found by `core.paths.config_dir` (source tree, colcon or pip install).
A joint prefix (franka_bringup's arm_prefix, ur_robot_driver's tf_prefix: `left_` names
`left_shoulder_pan_joint`) gives the names the joints carry on ROS; the simulator's models keep
the description's own names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import yaml

from vla_runtime.core.paths import config_dir
from vla_runtime.core.safety.joint_velocity_limits import check_model


@dataclass(frozen=True)
class RobotConfig:
    name: str
    joints: tuple[str, ...]
    home: tuple[float, ...]
    position_min: tuple[float, ...]
    position_max: tuple[float, ...]
    velocity: tuple[float, ...]
    acceleration: tuple[float, ...]
    jerk: tuple[float, ...]
    position_margin: float = 0.0
    tcp_speed: float | None = None
    # Position-dependent joint velocity limit model (core.safety.joint_velocity_limits), or None
    # where the flat `velocity` is all the manufacturer publishes.
    velocity_limits: str | None = None
    gripper_joints: tuple[str, ...] = ()
    gripper_max_width: float = 0.0
    gripper_max_speed: float = 0.0
    controllers: dict[str, str] = field(default_factory=dict)
    state_topic: str = "/joint_states"
    # The hand's workspace box (min xyz, max xyz; m, base frame) where the arm's mounting puts
    # the sim workcell elsewhere than core.safety.workspace's default; None: that default.
    workspace: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    @property
    def dof(self) -> int:
        return len(self.joints)

    def controller(self, key: str, name: str = "") -> str:
        """The controller of `key` in `controllers:` (trajectory, forward_position, gripper):
        `name` where a driver's parameter gives one, else this robot's."""
        return name or self.controllers[key]


# The arms the simulator models (sim/scene.py); the others are described for real hardware only.
SIMULATED_ROBOTS = ("fr3", "ur5e")
# A ROS name fragment: the prefixed joint names stay valid names (empty = no prefix).
JOINT_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)?")


def check_joint_prefix(prefix: str) -> str:
    """`prefix`, or a ValueError saying why it cannot prefix joint names."""
    if not JOINT_PREFIX.fullmatch(prefix):
        raise ValueError(f"joint_prefix {prefix!r} is no ROS name fragment (letters, digits and "
                         "underscores, not starting with a digit)")  # fmt: skip
    return prefix


def prefixed(names: Iterable[str], prefix: str) -> tuple[str, ...]:
    """The description's joint `names` as they are on ROS."""
    return tuple(prefix + name for name in names)


def unprefixed(names: Iterable[str], prefix: str) -> list[str]:
    """Joint `names` from ROS as the description names them; a ValueError lists those without
    `prefix` (another arm's, or unprefixed ones, which must not move this arm)."""
    names = list(names)
    foreign = [name for name in names if not name.startswith(prefix)]
    if foreign:
        raise ValueError(f"joint names {foreign} lack the prefix {prefix!r}")
    return [name[len(prefix) :] for name in names]


def _floats(values, what: str, n: int) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if len(out) != n:
        raise ValueError(f"{what}: expected {n} values, got {len(out)}")
    return out


def _velocity_model(model, n: int) -> str | None:
    if model is None:
        return None
    check_model(str(model))
    if n != 7:
        raise ValueError(f"velocity_limits {model!r} describes 7 joints, the robot has {n}")
    return str(model)


def load_robot(name: str, joint_prefix: str = "") -> RobotConfig:
    """Read config/robots/<name>.yaml, its joint and gripper joint names prefixed with
    `joint_prefix` (the names on ROS); raises FileNotFoundError / ValueError with the reason."""
    check_joint_prefix(joint_prefix)
    path = config_dir() / "robots" / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no robot description {path}")
    with path.open() as f:
        raw = yaml.safe_load(f)
    joints = prefixed(raw["joints"], joint_prefix)
    n = len(joints)
    limits = raw["limits"]
    gripper = raw.get("gripper") or {}
    return RobotConfig(
        name=raw.get("name", name),
        joints=joints,
        home=_floats(raw["home"], "home", n),
        position_min=_floats(limits["position_min"], "position_min", n),
        position_max=_floats(limits["position_max"], "position_max", n),
        velocity=_floats(limits["velocity"], "velocity", n),
        acceleration=_floats(limits["acceleration"], "acceleration", n),
        jerk=_floats(limits["jerk"], "jerk", n),
        position_margin=float(limits.get("position_margin", 0.0)),
        tcp_speed=float(limits["tcp_speed"]) if "tcp_speed" in limits else None,
        velocity_limits=_velocity_model(raw.get("velocity_limits"), n),
        gripper_joints=prefixed(gripper.get("joints", ()), joint_prefix),
        gripper_max_width=float(gripper.get("max_width", 0.0)),
        gripper_max_speed=float(gripper.get("max_speed", 0.0)),
        controllers=dict(raw.get("controllers") or {}),
        state_topic=raw.get("state_topic", "/joint_states"),
        workspace=_workspace(raw.get("workspace")),
    )


def _workspace(raw) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    if raw is None:
        return None
    low, high = _floats(raw["min"], "workspace min", 3), _floats(raw["max"], "workspace max", 3)
    if any(lo >= hi for lo, hi in zip(low, high, strict=True)):
        raise ValueError(f"workspace min {low} must lie below max {high} on every axis")
    return low, high
