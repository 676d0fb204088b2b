"""Cartesian geometry of single commands at the control rate: workspace planes, keep-out boxes,
table clearance, self clearance and TCP speed, from forward kinematics per tick.

The decisions are the chunk checker's (chunk_check.py): the same arm points (every joint frame
origin, the flange and the TCP, and the midpoint of each link between them), the same hand
points (flange and TCP), the same hand outline (the corners of the palm and of the fingertips,
which reach past the TCP) and the same `Workcell.violations`, so a configuration a chunk is
truncated before is refused here too. Forward kinematics keeps the chain's constant matrices
(built once) and evaluates a batch of configurations in one pass per joint, cheap enough for
every 4 ms tick.
"""

from __future__ import annotations

import math

import numpy as np

from vla_runtime.core.kinematics import DHChain, chain_for
from vla_runtime.core.robot import RobotConfig
from vla_runtime.core.safety.workspace import Workcell


def arm_and_hand_points(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From the chain's frame origins (..., dof + 2, 3) (`DHChain.points`): the arm points the
    clearance checks look at (the origins and the midpoint of each link, (..., 2 dof + 3, 3))
    and the hand points that stay in the workspace (flange and TCP, (..., 2, 3))."""
    midpoints = 0.5 * (points[..., 1:, :] + points[..., :-1, :])
    return np.concatenate([points, midpoints], axis=-2), points[..., -2:, :]


def hand_outline(chain: DHChain) -> np.ndarray:
    """The corners of the chain's hand in its TCP frame, (m, 3); none without a hand."""
    return np.zeros((0, 3)) if chain.hand is None else chain.hand.outline()


class ChainPoints:
    """`DHChain.points` with the chain's constant matrices computed once: one batched product
    per joint for any number of configurations."""

    def __init__(self, chain: DHChain):
        pre, post = chain._fixed_parts()
        self.dof = chain.dof
        self.name = chain.name
        self.pre = np.stack(pre)  # (dof, 4, 4)
        self.post = np.stack(post)
        self.flange = np.asarray(chain.flange, dtype=float)
        self.flange_tool = self.flange @ np.asarray(chain.tool, dtype=float)
        self.outline = hand_outline(chain)

    def __call__(self, qs: np.ndarray) -> np.ndarray:
        """Frame origins of each joint, the flange and the TCP, (n, dof + 2, 3), for qs (n, dof)."""
        return self.frames(qs)[0]

    def frames(self, qs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The frame origins as `__call__`, and the hand's outline in the base frame,
        (n, m, 3), for qs (n, dof)."""
        n = qs.shape[0]
        rot = np.zeros((n, self.dof, 4, 4))
        c, s = np.cos(qs), np.sin(qs)
        rot[..., 0, 0] = rot[..., 1, 1] = c
        rot[..., 0, 1] = -s
        rot[..., 1, 0] = s
        rot[..., 2, 2] = rot[..., 3, 3] = 1.0
        links = self.pre @ rot @ self.post  # (n, dof, 4, 4): each joint's transform
        out = np.empty((n, self.dof + 2, 3))
        pose = links[:, 0]
        out[:, 0] = pose[:, :3, 3]
        for i in range(1, self.dof):
            pose = pose @ links[:, i]
            out[:, i] = pose[:, :3, 3]
        # Origins only: pose @ M moves the origin to pose's rotation applied to M's translation.
        for k, fixed in ((self.dof, self.flange), (self.dof + 1, self.flange_tool)):
            out[:, k] = pose[:, :3, :3] @ fixed[:3, 3] + pose[:, :3, 3]
        tcp_rotation = pose[:, :3, :3] @ self.flange_tool[:3, :3]
        outline = self.outline @ tcp_rotation.transpose(0, 2, 1) + out[:, -1:]
        return out, outline


def _reason(name: str, worst: float) -> str:
    """A violation as Workcell.violations names it, with its number for this configuration."""
    if name.startswith("workspace plane"):
        return f"{name}: {worst:.3f} m beyond"
    if name == "table clearance":
        return f"{name}: {worst:.3f} m below"
    if name.startswith("self clearance"):
        return f"{name}: {worst:.3f} m from the base axis"
    return name


class CommandGeometry:
    """Whether an arm configuration may be commanded, and the TCP speed between two."""

    def __init__(self, chain: DHChain, workcell: Workcell, tcp_speed_limit: float | None = None):
        if tcp_speed_limit is not None and not tcp_speed_limit > 0.0:
            raise ValueError(f"tcp_speed must be > 0 m/s or unset, got {tcp_speed_limit}")
        self.chain = chain
        self.workcell = workcell
        self.tcp_speed_limit = tcp_speed_limit
        self.dof = chain.dof
        self._points = ChainPoints(chain)
        self._planes = {f"workspace plane {plane.name}": plane for plane in workcell.workspace}

    @classmethod
    def from_robot(
        cls, robot: RobotConfig, workcell: Workcell, tcp_speed: float | None = None
    ) -> CommandGeometry:
        """The robot's kinematics; `tcp_speed` (m/s) overrides the robot's `tcp_speed`."""
        chain = chain_for(robot.name)
        if chain.dof != robot.dof:
            raise ValueError(f"kinematics {chain.name} has {chain.dof} joints, robot {robot.dof}")
        limit = tcp_speed if tcp_speed is not None else robot.tcp_speed
        return cls(chain, workcell, limit)

    def _configurations(self, qs) -> np.ndarray:
        qs = np.asarray(qs, dtype=float)
        if qs.ndim != 2 or qs.shape[1] != self.dof:
            raise ValueError(f"{self.chain.name}: expected (n, {self.dof}) joint positions, "
                             f"got shape {qs.shape}")  # fmt: skip
        return qs

    def points(self, qs) -> np.ndarray:
        """Frame origins (n, dof + 2, 3) of configurations qs (n, dof), as `DHChain.points`."""
        return self._points(self._configurations(qs))

    def position_violations(self, qs) -> list[str | None]:
        """Per configuration in qs (n, dof): None where the arm may stand there, else the first
        violated constraint (in Workcell.violations order) with its number."""
        qs = self._configurations(qs)
        finite = np.isfinite(qs).all(axis=1)
        # Non-finite rows would compare False everywhere, i.e. pass: refuse them outright.
        frames, outline = self._points.frames(np.where(finite[:, None], qs, 0.0))
        arm, hand = arm_and_hand_points(frames)
        found = self.workcell.violations(arm, hand, outline)
        out: list[str | None] = [None if ok else "non-finite joint positions" for ok in finite]
        if not found:
            return out
        for name, mask, _ in reversed(found):  # the first violation in order wins
            rows = np.nonzero(mask & finite)[0]
            if len(rows):
                worst = self._row_numbers(name, arm[rows], hand[rows], outline[rows])
                for k, i in enumerate(rows):
                    out[i] = _reason(name, float(worst[k]))
        return out

    def _row_numbers(
        self, name: str, arm: np.ndarray, hand: np.ndarray, outline: np.ndarray
    ) -> np.ndarray:
        """Workcell.violations' worst number of `name` for each configuration on its own (the
        batch's is over all of them)."""
        plane = self._planes.get(name)
        if plane is not None:
            return (hand @ np.asarray(plane.normal, dtype=float) - plane.offset).max(axis=1)
        if name == "table clearance":
            return self.workcell.table_depth(arm, outline)
        if name.startswith("self clearance"):
            return np.linalg.norm(hand[..., :2], axis=-1).min(axis=1)
        return np.zeros(len(arm))  # keep-out boxes carry no number

    def position_violation(self, q) -> str | None:
        """None where the arm may stand at joint positions q (dof,), else why not."""
        q = np.asarray(q, dtype=float)
        if q.shape != (self.dof,):
            raise ValueError(f"{self.chain.name}: expected {self.dof} joint positions, "
                             f"got shape {q.shape}")  # fmt: skip
        return self.position_violations(q[None])[0]

    def tcp_positions(self, qs) -> np.ndarray:
        """TCP positions (n, 3) of configurations qs (n, dof)."""
        return self.points(qs)[:, -1]

    def tcp_speed(self, q_from, q_to, dt: float) -> float:
        """Mean TCP speed (m/s) moving from q_from to q_to in dt s (straight-line distance)."""
        if not (math.isfinite(dt) and dt > 0.0):
            raise ValueError(f"dt must be a positive number of seconds, got {dt}")
        tcp = self.tcp_positions(np.stack([np.asarray(q_from, float), np.asarray(q_to, float)]))
        return float(np.linalg.norm(tcp[1] - tcp[0])) / dt

    def speed_violation(self, q_from, q_to, dt: float) -> str | None:
        """None when the TCP stays within `tcp_speed_limit` (or there is none), else why not."""
        if self.tcp_speed_limit is None:
            return None
        speed = self.tcp_speed(q_from, q_to, dt)
        if speed > self.tcp_speed_limit:  # a NaN speed fails the next test instead
            return f"TCP speed {speed:.3f} m/s > {self.tcp_speed_limit:g}"
        if not math.isfinite(speed):
            return "TCP speed unknown (non-finite joint positions)"
        return None
