"""After-the-fact checks of a recorded run (fault bench, fault tests): what reached the driver,
when the arm came to rest, and whether every chunk got a verdict. Pure logic, no ROS."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.robot import RobotConfig

RELATIVE_TOLERANCE = 1e-6  # float rounding of the gate's own arithmetic
RESUMED_REST_S = 0.05  # s: a rest shorter than this before a resume is a turning point


@dataclass(frozen=True)
class CommandAudit:
    commands: int
    unsafe: int  # commands that break a limit (each counted once)
    reasons: dict  # limit -> number of commands breaking it
    worst_ratio: dict  # limit -> largest |value| / limit seen
    unsafe_indices: tuple[int, ...] = ()
    limits: str = ""  # the table judged against


@dataclass(frozen=True)
class JointLimitTable:
    """What a command sequence is judged against: the position range, the velocity limits at a
    position (`velocity_bounds(q) -> (lower <= 0, upper >= 0)`, both shaped like q) and the
    acceleration and jerk limits (inf: not checked)."""

    name: str
    lower: np.ndarray
    upper: np.ndarray
    velocity_bounds: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    acceleration: np.ndarray
    jerk: np.ndarray

    @classmethod
    def from_robot(cls, robot: RobotConfig) -> JointLimitTable:
        """The gate's own table: config/robots/<robot>.yaml, positions less the margin, flat
        velocity limits."""
        velocity = np.asarray(robot.velocity, dtype=float)

        def flat(q):
            cap = np.broadcast_to(velocity, np.shape(q))
            return -cap, cap.copy()

        return cls(
            name=f"config/robots/{robot.name}.yaml",
            lower=np.asarray(robot.position_min) + robot.position_margin,
            upper=np.asarray(robot.position_max) - robot.position_margin,
            velocity_bounds=flat,
            acceleration=np.asarray(robot.acceleration, dtype=float),
            jerk=np.asarray(robot.jerk, dtype=float),
        )

    def joint_table(self) -> JointLimitTable:
        return self


def velocity_ratio(velocity: np.ndarray, at: np.ndarray, table: JointLimitTable) -> np.ndarray:
    """|velocity| over the limit in its direction at positions `at` (inf where the limit is 0
    and the joint moves that way)."""
    lower, upper = table.velocity_bounds(at)
    limit = np.where(velocity >= 0.0, upper, -lower)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(velocity) / limit
    return np.where(velocity == 0.0, 0.0, ratio)


def audit_commands(
    positions,
    robot: RobotConfig | None,
    period: float,
    segment_starts=(),
    gaps_s=(),
    limits=None,
) -> CommandAudit:
    """Check a sequence of arm position commands, one per control period, by finite differences:
    finite, the right size, inside the position limits, and velocity, acceleration and jerk
    within the limits.

    `limits`: the table to judge against, anything with `joint_table()` (a `JointLimitTable`,
    or the manufacturers' published table, core/safety/manufacturer_limits.py); None: the
    robot's own (config/robots/<robot>.yaml, positions less the margin). A velocity is judged
    against the limits at the command it starts from (libfranka evaluates its
    position-dependent limits at the last commanded position).

    `segment_starts` are indices where a new gate took over (a restarted safety node): the
    arm held still for `gaps_s[i]` seconds before, so only the position change across the gap,
    over that time, is checked there (derivatives restart from rest)."""
    if limits is None and robot is None:
        raise ValueError("audit_commands needs a robot or a limits table")
    table = JointLimitTable.from_robot(robot) if limits is None else limits.joint_table()
    dof = len(table.lower)
    if robot is not None and robot.dof != dof:
        raise ValueError(f"{table.name} has {dof} joints, robot {robot.name} {robot.dof}")
    rows = [np.asarray(p, dtype=float) for p in positions]
    reasons: Counter = Counter()
    bad = np.zeros(len(rows), dtype=bool)
    shaped = np.array([r.shape == (dof,) and np.isfinite(r).all() for r in rows], dtype=bool)
    reasons["malformed"] = int((~shaped).sum())
    bad |= ~shaped
    worst = {}

    def result() -> CommandAudit:
        return CommandAudit(len(rows), int(bad.sum()), dict(+reasons), worst, _indices(bad),
                            table.name)  # fmt: skip

    if not shaped.any():
        return result()
    q = np.array([r if ok else np.full(dof, np.nan) for r, ok in zip(rows, shaped, strict=True)])
    with np.errstate(invalid="ignore"):
        outside = ((q < table.lower - 1e-9) | (q > table.upper + 1e-9)).any(axis=1)
    reasons["position"] = int(outside.sum())
    bad |= outside
    limits_by_order = {"acceleration": table.acceleration, "jerk": table.jerk}
    starts = sorted({0, *segment_starts})
    bounds = [*starts[1:], len(rows)]
    for i, (start, end) in enumerate(zip(starts, bounds, strict=True)):
        if start > 0 and i - 1 < len(gaps_s):
            step = (q[start] - q[start - 1]) / max(gaps_s[i - 1], period)
            with np.errstate(invalid="ignore"):
                ratio = np.nanmax(velocity_ratio(step, q[start - 1], table))
            worst["velocity"] = max(worst.get("velocity", 0.0), float(ratio))
            if ratio > 1 + RELATIVE_TOLERANCE:
                reasons["velocity"] += 1
                bad[start] = True
        derivative = q[start:end]
        for order, name in enumerate(("velocity", "acceleration", "jerk"), start=1):
            derivative = np.diff(derivative, axis=0) / period
            if len(derivative) == 0:
                break
            if name == "velocity":
                ratio = velocity_ratio(derivative, q[start : end - 1], table)
            else:
                ratio = np.abs(derivative) / limits_by_order[name]
            with np.errstate(invalid="ignore"):
                over = (ratio > 1 + RELATIVE_TOLERANCE).any(axis=1)
            if ratio.size and np.isfinite(ratio).any():
                worst[name] = max(worst.get(name, 0.0), float(np.nanmax(ratio)))
            reasons[name] += int(over.sum())
            # The command that completes an offending difference is the one blamed.
            bad[start + order : end] |= over
    return result()


def _indices(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.nonzero(mask)[0])


def time_to_rest(
    times, velocities, after: float, threshold: float = 0.02, hold_s: float = 0.2, resumed=()
) -> float | None:
    """Seconds from `after` until the measured joint speed stays below `threshold` (rad/s, every
    joint) for `hold_s`, or for at least RESUMED_REST_S until the loop resumed on purpose (one of
    the `resumed` times, e.g. a fresh chunk accepted after a transient fault, lies within the
    rest: a turning point of the motion is shorter); None if it never does within the record."""
    t = np.asarray(times, dtype=float)
    speed = np.abs(np.asarray(velocities, dtype=float)).max(axis=1)
    keep = t >= after
    t, speed = t[keep], speed[keep]
    moving = np.nonzero(speed >= threshold)[0]
    candidates = [0] if len(moving) == 0 else [0, *(moving + 1)]
    for i in candidates:
        if i >= len(t):
            return None
        nxt = moving[moving >= i]
        until = t[nxt[0]] if len(nxt) else t[-1]
        rest = until - t[i]
        if rest >= hold_s or (rest >= RESUMED_REST_S and any(t[i] <= r <= until for r in resumed)):
            return float(t[i] - after)
    return None


def unjudged_chunks(sent, verdict_stamps) -> list[int]:
    """Indices of the chunks in `sent` (their stamps, in order of arrival) that no verdict in
    `verdict_stamps` answers, matching by stamp as a multiset (a frozen camera can stamp two
    chunks alike)."""
    left = Counter(round(s, 6) for s in verdict_stamps)
    missing = []
    for i, stamp in enumerate(sent):
        key = round(stamp, 6)
        if left[key] > 0:
            left[key] -= 1
        else:
            missing.append(i)
    return missing
