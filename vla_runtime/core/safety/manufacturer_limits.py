"""The manufacturers' published joint limits (config/limits/<robot>.yaml), and the audit of a
command sequence against them.

The gate enforces config/robots/<robot>.yaml; judging its output against that same table would
be circular. This table is read from the manufacturers' documents alone (each value block names
its source and the date it was read), has no gate margin, and adds the position-dependent
joint velocity limits where the manufacturer publishes them (`velocity_limits_model`,
core/safety/joint_velocity_limits.py). A block a manufacturer does not publish is `values:
null` with a `note`; the audit skips that check. Pure logic, no ROS.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from vla_runtime.core.paths import config_dir
from vla_runtime.core.safety.audit import CommandAudit, JointLimitTable, audit_commands
from vla_runtime.core.safety.joint_velocity_limits import check_model, velocity_limits

JOINT_BLOCKS = ("position_min", "position_max", "velocity", "acceleration", "jerk")
REQUIRED_BLOCKS = ("position_min", "position_max", "velocity")  # no audit without them
SCALAR_BLOCKS = ("tcp_speed",)
# A joint that turns without end (the UR3e's wrist 3) has no published position limit: -.inf
# and .inf in the table.
UNBOUNDED = {"position_min": -np.inf, "position_max": np.inf}

# (q (..., dof)) -> (lower <= 0, upper >= 0) joint velocity limits (rad/s), same shape
VelocityBounds = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Source:
    """Where a value block was read, and when."""

    url: str
    read: str  # ISO date
    note: str = ""


@dataclass(frozen=True)
class ManufacturerLimits:
    robot: str
    joints: tuple[str, ...]
    position_min: tuple[float, ...]
    position_max: tuple[float, ...]
    velocity: tuple[float, ...]  # rad/s, the flat cap
    acceleration: tuple[float, ...] | None  # None: not published
    jerk: tuple[float, ...] | None
    tcp_speed: float | None  # m/s, the Cartesian interface's limit; None: not published
    velocity_limits_model: str | None = None
    sources: dict[str, Source] = field(default_factory=dict)  # block -> where it was read

    @property
    def dof(self) -> int:
        return len(self.joints)

    def velocity_bounds(self, q) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) joint velocity limits at positions `q` (..., dof): the
        position-dependent model where one is published, never beyond the flat cap."""
        q = np.asarray(q, dtype=float)
        cap = np.broadcast_to(np.asarray(self.velocity, dtype=float), q.shape)
        if self.velocity_limits_model is None:
            return -cap, cap.copy()
        lower, upper = velocity_limits(self.velocity_limits_model, q)
        return np.maximum(lower, -cap), np.minimum(upper, cap)

    def joint_table(self) -> JointLimitTable:
        """The table `audit_commands(..., limits=)` judges against: no margin."""
        dof = self.dof
        unpublished = np.full(dof, np.inf)
        return JointLimitTable(
            name=f"config/limits/{self.robot}.yaml",
            lower=np.asarray(self.position_min, dtype=float),
            upper=np.asarray(self.position_max, dtype=float),
            velocity_bounds=self.velocity_bounds,
            acceleration=np.asarray(self.acceleration or unpublished, dtype=float),
            jerk=np.asarray(self.jerk or unpublished, dtype=float),
        )


def limits_path(robot_name: str) -> Path:
    return config_dir() / "limits" / f"{robot_name}.yaml"


def load_manufacturer_limits(robot_name: str, path: Path | str | None = None) -> ManufacturerLimits:
    """Read and validate config/limits/<robot_name>.yaml (or `path`); a bad or missing file is a
    one-line ValueError naming the file and what is wrong."""
    path = Path(path) if path is not None else limits_path(robot_name)
    if not path.is_file():
        raise ValueError(f"no manufacturer limits table {path}")
    try:
        raw = yaml.safe_load(path.read_text())
        return _parse(raw)
    except (yaml.YAMLError, TypeError, KeyError, ValueError) as exc:
        line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: {line}") from None


def _parse(raw) -> ManufacturerLimits:
    if not isinstance(raw, dict):
        raise ValueError("expected a mapping at the top level")
    joints = tuple(str(j) for j in raw["joints"])
    if not joints:
        raise ValueError("no joints")
    dof = len(joints)
    sources: dict[str, Source] = {}
    values: dict[str, object] = {}
    for name in (*JOINT_BLOCKS, *SCALAR_BLOCKS):
        if name not in raw:
            raise ValueError(f"block {name!r} missing (write values: null and a note where "
                             "the manufacturer publishes none)")  # fmt: skip
        block = raw[name]
        sources[name] = _source(name, block)
        value = block.get("values")
        if value is None:
            if name in REQUIRED_BLOCKS:
                raise ValueError(f"{name}: values required")
            if not sources[name].note:
                raise ValueError(f"{name}: values null without a note saying why")
            values[name] = None
        elif name in SCALAR_BLOCKS:
            values[name] = _positive(name, [value])[0]
        else:
            values[name] = _floats(name, value, dof, UNBOUNDED.get(name))
    for name in ("velocity", "acceleration", "jerk"):
        if values[name] is not None:
            _positive(name, values[name])
    if any(lo >= hi for lo, hi in zip(values["position_min"], values["position_max"], strict=True)):
        raise ValueError("position_min must lie below position_max on every joint")
    model = raw.get("velocity_limits_model")
    if model is not None:
        check_model(str(model))
        sources["velocity_limits_model"] = _source("velocity_limits_source",
                                                   raw.get("velocity_limits_source"))  # fmt: skip
        velocity_limits(str(model), np.zeros(dof))  # the model describes this many joints
    return ManufacturerLimits(
        robot=str(raw["robot"]),
        joints=joints,
        position_min=values["position_min"],
        position_max=values["position_max"],
        velocity=values["velocity"],
        acceleration=values["acceleration"],
        jerk=values["jerk"],
        tcp_speed=values["tcp_speed"],
        velocity_limits_model=None if model is None else str(model),
        sources=sources,
    )


def _source(name: str, block) -> Source:
    if not isinstance(block, dict):
        raise ValueError(f"{name}: expected a mapping with values, source and read")
    url, read = block.get("source"), block.get("read")
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise ValueError(f"{name}: source must be the URL the values were read from")
    if isinstance(read, datetime.date):
        read = read.isoformat()
    try:
        datetime.date.fromisoformat(str(read))
    except ValueError:
        raise ValueError(f"{name}: read must be the date read (YYYY-MM-DD), got {read!r}") from None
    return Source(url, str(read), str(block.get("note") or ""))


def _floats(name: str, values, n: int, unbounded: float | None = None) -> tuple[float, ...]:
    """`n` finite values; `unbounded` (an infinity) is allowed too, for a joint without limit."""
    out = tuple(float(v) for v in values)
    if len(out) != n:
        raise ValueError(f"{name}: expected {n} values, got {len(out)}")
    if not all(np.isfinite(v) or v == unbounded for v in out):
        raise ValueError(f"{name}: non-finite values {list(out)}")
    return out


def _positive(name: str, values) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if not all(np.isfinite(v) and v > 0 for v in out):
        raise ValueError(f"{name}: limits must be finite and > 0, got {list(out)}")
    return out


def audit_against_manufacturer(
    positions,
    limits: ManufacturerLimits,
    period: float,
    segment_starts=(),
    gaps_s=(),
) -> CommandAudit:
    """`audit_commands` against the published table: positions within the published range (no
    margin), velocity within the position-dependent limits, acceleration and jerk where
    published; finite differences one `period` apart."""
    return audit_commands(positions, None, period, segment_starts, gaps_s, limits=limits)
