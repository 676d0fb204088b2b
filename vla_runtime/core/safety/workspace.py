"""Cartesian safety geometry in the robot base frame: workspace planes, keep-out boxes, the table.

Points are arrays (..., 3) in metres. Every test returns a boolean mask over the leading axes so
that callers find the first offending chunk point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Plane:
    """Half-space n . p <= offset is inside (n need not be unit; offset in the same scale)."""

    normal: tuple[float, float, float]
    offset: float
    name: str = ""

    def outside(self, points: np.ndarray) -> np.ndarray:
        return np.asarray(points) @ np.asarray(self.normal, dtype=float) > self.offset


@dataclass(frozen=True)
class Box:
    """Axis-aligned box [lo, hi]."""

    lo: tuple[float, float, float]
    hi: tuple[float, float, float]
    name: str = ""

    def contains(self, points: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """Points inside the box grown by `margin` on every side."""
        p = np.asarray(points)
        lo, hi = np.asarray(self.lo) - margin, np.asarray(self.hi) + margin
        return np.all((p >= lo) & (p <= hi), axis=-1)


def box_planes(lo, hi) -> tuple[Plane, ...]:
    """The six planes bounding the box [lo, hi] as a workspace."""
    planes = []
    for axis, label in enumerate("xyz"):
        n = [0.0, 0.0, 0.0]
        n[axis] = 1.0
        planes.append(Plane(tuple(n), float(hi[axis]), f"{label} <= {hi[axis]:g}"))
        n = [0.0, 0.0, 0.0]
        n[axis] = -1.0
        planes.append(Plane(tuple(n), -float(lo[axis]), f"{label} >= {lo[axis]:g}"))
    return tuple(planes)


# The sim workcell's table top (vla_runtime.sim.workcell): x in [-0.25, 0.95], y in [-0.8, 0.8],
# top at z = 0 where the robot base stands. Above 1.2 m nothing on the table needs reaching.
WORKSPACE_MIN, WORKSPACE_MAX = (-0.25, -0.8, -0.05), (0.95, 0.8, 1.2)  # m, robot base frame
DEFAULT_WORKSPACE = box_planes(WORKSPACE_MIN, WORKSPACE_MAX)


@dataclass(frozen=True)
class Workcell:
    """What the checks need to know about the surroundings."""

    workspace: tuple[Plane, ...] = DEFAULT_WORKSPACE
    keep_out: tuple[Box, ...] = ()
    table_height: float = 0.0
    table_clearance: float = 0.005  # every arm point stays this far above the table top
    # The hand's outline (palm and fingertip corners) stays this far above the top; None: only
    # the arm points count. Off by default: the shipped pick policy grasps with the fingertips
    # at the top, and holding them above it vetoed a third of its chunks (success 14 -> 9 of 20).
    outline_clearance: float | None = None
    # Keep-out boxes are grown by this much: the points checked lie on the links' axes, and the
    # links and the hand are wider than those points (with 8 cm, 24 of 43 keep-out entries in
    # `bench safety` were the hand's, unseen by the check).
    keep_out_margin: float = 0.12
    # Self clearance: the hand must not come back over the robot's own base column, a vertical
    # cylinder around the base z axis.
    base_radius: float = 0.12
    base_height: float = 0.45

    def table_depth(self, arm_points: np.ndarray, outline: np.ndarray | None = None) -> np.ndarray:
        """How far each configuration reaches below its floor (m; negative: clear of it): the
        arm points below the clearance, the outline below `outline_clearance`."""
        depth = self.table_height + self.table_clearance - arm_points[..., 2].min(axis=-1)
        if self.outline_clearance is not None and outline is not None and outline.shape[-2]:
            floor = self.table_height + self.outline_clearance
            depth = np.maximum(depth, floor - outline[..., 2].min(axis=-1))
        return depth

    def violations(
        self,
        arm_points: np.ndarray,
        hand_points: np.ndarray,
        outline: np.ndarray | None = None,
        allowed_depth: float = 0.0,
    ) -> list[tuple]:
        """Per kind of violation, (name, mask over the leading axes, worst number).

        arm_points (..., K, 3): points along the whole arm; hand_points (..., M, 3): the points
        of the hand (flange, TCP) that must stay in the workspace and away from the base;
        outline (..., L, 3): the hand's corners (palm, fingertips), kept above the table top
        by `outline_clearance` (the keep-out margin already covers the hand's width);
        allowed_depth: how far below the table floor counts as clear (an arm already that deep
        may stay there or rise, never sink further)."""
        found = []
        for plane in self.workspace:
            excess = hand_points @ np.asarray(plane.normal, dtype=float) - plane.offset
            mask = np.any(excess > 0.0, axis=-1)
            if mask.any():
                found.append((f"workspace plane {plane.name}", mask, float(excess.max())))
        for box in self.keep_out:
            mask = np.any(box.contains(arm_points, self.keep_out_margin), axis=-1)
            if mask.any():
                found.append((f"keep-out box {box.name}", mask, 0.0))
        depth = self.table_depth(arm_points, outline)
        mask = depth > allowed_depth
        if mask.any():
            found.append(("table clearance", mask, float(depth.max())))
        radial = np.linalg.norm(hand_points[..., :2], axis=-1)
        near_base = (radial < self.base_radius) & (hand_points[..., 2] < self.base_height)
        mask = np.any(near_base, axis=-1)
        if mask.any():
            found.append(("self clearance (hand over the base)", mask, float(radial.min())))
        return found


def keep_out_boxes(values) -> tuple[Box, ...]:
    """Keep-out boxes from a flat list of 6 values per box (min x y z, max x y z), named #0, #1…"""
    if len(values) % 6:
        raise ValueError(f"keep_out_boxes needs 6 values per box, got {len(values)}")
    return tuple(
        Box(tuple(values[i : i + 3]), tuple(values[i + 3 : i + 6]), f"#{i // 6}")
        for i in range(0, len(values), 6)
    )
