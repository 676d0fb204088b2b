"""Forward kinematics of the supported arms from their published DH parameters (no ROS, numpy).

Franka FR3 and Panda share Craig's modified DH table (Franka docs); the UR arms (UR3e, UR5e,
UR10e, UR16e, UR20, UR30) use standard DH (Universal Robots). All functions take batches of
configurations, shape (..., dof), because the safety checks evaluate whole chunks at once.
Positions are in the robot base frame, metres.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Array = np.ndarray


def _rot_z(theta: Array) -> Array:
    c, s = np.cos(theta), np.sin(theta)
    out = np.zeros(theta.shape + (4, 4))
    out[..., 0, 0], out[..., 0, 1] = c, -s
    out[..., 1, 0], out[..., 1, 1] = s, c
    out[..., 2, 2] = out[..., 3, 3] = 1.0
    return out


def _fixed(rot_x: float = 0.0, x: float = 0.0, rot_z: float = 0.0, z: float = 0.0) -> Array:
    """RotX(rot_x) * TransX(x) * RotZ(rot_z) * TransZ(z) as one 4x4 matrix."""
    ca, sa = math.cos(rot_x), math.sin(rot_x)
    rx = np.array([[1, 0, 0, x], [0, ca, -sa, 0], [0, sa, ca, 0], [0, 0, 0, 1]], dtype=float)
    cz, sz = math.cos(rot_z), math.sin(rot_z)
    rz = np.array([[cz, -sz, 0, 0], [sz, cz, 0, 0], [0, 0, 1, z], [0, 0, 0, 1]], dtype=float)
    return rx @ rz


@dataclass(frozen=True)
class Hand:
    """A parallel gripper's extent in its TCP frame (m; z along the approach, the fingers
    closing along y): the palm's box and each finger's box over the whole stroke. However the
    hand is turned, none of it lies lower than the lowest of `outline`'s corners; pointing
    down, those are the fingertips', beyond the TCP."""

    palm_lo: tuple[float, float, float]
    palm_hi: tuple[float, float, float]
    finger_half_x: float  # a finger's half-width across the closing direction
    finger_y: tuple[float, float]  # its inner and outer faces beyond one finger's opening
    finger_tip: float  # z of the fingertips
    stroke: float  # one finger's largest opening

    def outline(self) -> Array:
        """(16, 3): the palm's 8 corners, then the fingertips' corners (x, inner face when
        closed and outer face fully open, of either finger)."""
        palm = [(x, y, z) for x in (self.palm_lo[0], self.palm_hi[0])
                for y in (self.palm_lo[1], self.palm_hi[1])
                for z in (self.palm_lo[2], self.palm_hi[2])]  # fmt: skip
        inner, outer = self.finger_y[0], self.stroke + self.finger_y[1]
        tips = [(x, side * y, self.finger_tip) for x in (-self.finger_half_x, self.finger_half_x)
                for side in (-1.0, 1.0) for y in (inner, outer)]  # fmt: skip
        return np.array(palm + tips, dtype=float)


@dataclass(frozen=True)
class DHChain:
    """A serial arm: DH rows (a, d, alpha) per joint, then fixed flange and tool transforms.

    modified=True (Craig): T_i = RotX(alpha_i) TransX(a_i) RotZ(q_i) TransZ(d_i).
    modified=False (standard): T_i = RotZ(q_i) TransZ(d_i) TransX(a_i) RotX(alpha_i).
    """

    name: str
    a: tuple[float, ...]
    d: tuple[float, ...]
    alpha: tuple[float, ...]
    modified: bool
    flange: Array  # 4x4, last joint frame -> flange
    tool: Array  # 4x4, flange -> TCP
    hand: Hand | None = None  # the gripper around the TCP; None: nothing beyond the TCP

    @property
    def dof(self) -> int:
        return len(self.a)

    def _fixed_parts(self) -> tuple[list[Array], list[Array]]:
        """The constant matrices before and after each joint rotation."""
        if self.modified:
            pre = [_fixed(al, a) for a, al in zip(self.a, self.alpha, strict=True)]
            post = [_fixed(z=d) for d in self.d]
        else:
            pre = [np.eye(4)] * self.dof
            post = [
                _fixed(z=d) @ _fixed(x=a) @ _fixed(al)
                for a, d, al in zip(self.a, self.d, self.alpha, strict=True)
            ]
        return pre, post

    def joint_frames(self, q) -> Array:
        """Transforms base -> frame of each joint, then flange, then TCP: (..., dof + 2, 4, 4)."""
        q = np.asarray(q, dtype=float)
        if q.shape[-1] != self.dof:
            raise ValueError(f"{self.name}: expected {self.dof} joint values, got {q.shape[-1]}")
        frames = np.empty(q.shape[:-1] + (self.dof + 2, 4, 4))
        pose = np.broadcast_to(np.eye(4), q.shape[:-1] + (4, 4))
        pre, post = self._fixed_parts()
        for i in range(self.dof):
            pose = pose @ pre[i] @ _rot_z(q[..., i]) @ post[i]
            frames[..., i, :, :] = pose
        pose = pose @ self.flange
        frames[..., self.dof, :, :] = pose
        frames[..., self.dof + 1, :, :] = pose @ self.tool
        return frames

    def tcp_pose(self, q) -> Array:
        return self.joint_frames(q)[..., -1, :, :]

    def tcp_position(self, q) -> Array:
        """TCP position (..., 3)."""
        return self.joint_frames(q)[..., -1, :3, 3]

    def flange_position(self, q) -> Array:
        return self.joint_frames(q)[..., -2, :3, 3]

    def points(self, q) -> Array:
        """Origins of every joint frame, the flange and the TCP (..., dof + 2, 3): the points the
        workspace and clearance checks look at."""
        return self.joint_frames(q)[..., :3, 3]


def tcp_speeds(chain: DHChain, times, q) -> Array:
    """Finite-difference TCP speed (m/s) between consecutive configurations, shape (n - 1,)."""
    p = chain.tcp_position(q)
    dt = np.diff(np.asarray(times, dtype=float))
    return np.linalg.norm(np.diff(p, axis=0), axis=1) / dt


_HALF_PI = math.pi / 2
# The Franka Hand's collision geometry (franky-sim fr3.xml, meshes hand and finger, finger
# pads), measured in the TCP frame: the fingertips end 9 mm beyond the TCP, the palm is
# 0.21 m long across the fingers.
FRANKA_HAND = Hand(
    palm_lo=(-0.032, -0.104, -0.130),
    palm_hi=(0.032, 0.104, -0.037),
    finger_half_x=0.011,
    finger_y=(0.0015, 0.027),
    finger_tip=0.009,
    stroke=0.04,
)
# Franka docs (Craig's modified DH); the hand's TCP is 0.1034 m beyond the flange, the hand
# rotated -45 degrees about the flange z axis.
FRANKA = DHChain(
    name="franka",
    a=(0.0, 0.0, 0.0, 0.0825, -0.0825, 0.0, 0.088),
    d=(0.333, 0.0, 0.316, 0.0, 0.384, 0.0, 0.0),
    alpha=(0.0, -_HALF_PI, _HALF_PI, _HALF_PI, -_HALF_PI, _HALF_PI, _HALF_PI),
    modified=True,
    flange=_fixed(z=0.107),
    tool=_fixed(rot_z=-math.pi / 4, z=0.1034),
    hand=FRANKA_HAND,
)


def _ur(name: str, d1: float, a2: float, a3: float, d4: float, d5: float, d6: float) -> DHChain:
    """A UR arm: every model shares one standard DH layout and differs only in its lengths (m);
    TCP = flange (no tool)."""
    return DHChain(
        name=name,
        a=(0.0, a2, a3, 0.0, 0.0, 0.0),
        d=(d1, 0.0, 0.0, d4, d5, d6),
        alpha=(_HALF_PI, 0.0, 0.0, _HALF_PI, -_HALF_PI, 0.0),
        modified=False,
        flange=np.eye(4),
        tool=np.eye(4),
    )


# Universal Robots' published DH parameters of the e-Series, UR20 and UR30 (universal-robots.com
# "DH Parameters for calculations of kinematics and dynamics"; the same numbers as
# Universal_Robots_ROS2_Description config/<type>/default_kinematics.yaml).
UR3E = _ur("ur3e", d1=0.15185, a2=-0.24355, a3=-0.2132, d4=0.13105, d5=0.08535, d6=0.0921)
UR5E = _ur("ur5e", d1=0.1625, a2=-0.425, a3=-0.3922, d4=0.1333, d5=0.0997, d6=0.0996)
UR10E = _ur("ur10e", d1=0.1807, a2=-0.6127, a3=-0.57155, d4=0.17415, d5=0.11985, d6=0.11655)
UR16E = _ur("ur16e", d1=0.1807, a2=-0.4784, a3=-0.36, d4=0.17415, d5=0.11985, d6=0.11655)
UR20 = _ur("ur20", d1=0.2363, a2=-0.862, a3=-0.7287, d4=0.201, d5=0.1593, d6=0.1543)
UR30 = _ur("ur30", d1=0.2363, a2=-0.637, a3=-0.5037, d4=0.201, d5=0.1593, d6=0.1543)
UR_CHAINS = {chain.name: chain for chain in (UR3E, UR5E, UR10E, UR16E, UR20, UR30)}
CHAINS = {"fr3": FRANKA, "panda": FRANKA, **UR_CHAINS}


def chain_for(robot: str) -> DHChain:
    try:
        return CHAINS[robot]
    except KeyError:
        raise ValueError(f"no kinematics for robot {robot!r}; known: {sorted(CHAINS)}") from None


def _rotation_error(current: Array, target: Array) -> Array:
    """Rotation vector taking `current` to `target` (small-angle form of the axis-angle)."""
    r = target @ current.T
    return 0.5 * np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])


def solve_ik(
    chain: DHChain,
    seed,
    position,
    rotation=None,
    iterations: int = 100,
    damping: float = 1e-3,
    tolerance: float = 1e-5,
) -> tuple[Array, float]:
    """TCP pose inverse kinematics by damped least squares with a finite-difference Jacobian.

    Returns the configuration and its remaining position error (m). `rotation` (3x3) is the
    wanted TCP orientation; None keeps the seed's. Joint limits are not enforced: callers check
    the result like any other command."""
    q = np.array(seed, dtype=float)
    target_p = np.asarray(position, dtype=float)
    target_r = chain.tcp_pose(q)[:3, :3] if rotation is None else np.asarray(rotation, float)
    eps = 1e-6
    for _ in range(iterations):
        probes = np.vstack([q, q + eps * np.eye(chain.dof)])
        poses = chain.tcp_pose(probes)
        error = np.concatenate(
            [target_p - poses[0, :3, 3], _rotation_error(poses[0, :3, :3], target_r)]
        )
        if np.linalg.norm(error[:3]) < tolerance and np.linalg.norm(error[3:]) < 10 * tolerance:
            break
        jac = np.empty((6, chain.dof))
        for i in range(chain.dof):
            moved = poses[i + 1]
            jac[:3, i] = (moved[:3, 3] - poses[0, :3, 3]) / eps
            jac[3:, i] = _rotation_error(poses[0, :3, :3], moved[:3, :3]) / eps
        step = jac.T @ np.linalg.solve(jac @ jac.T + damping * np.eye(6), error)
        q = q + step
    return q, float(np.linalg.norm(target_p - chain.tcp_position(q)))


def cartesian_path(chain: DHChain, seed, waypoints, steps_per_segment: int) -> Array:
    """Joint configurations moving the TCP along straight lines through `waypoints` (m), keeping
    the seed's TCP orientation: (len(waypoints) * steps_per_segment, dof), excluding the start."""
    q = np.array(seed, dtype=float)
    rotation = chain.tcp_pose(q)[:3, :3]
    current = chain.tcp_position(q)
    out = []
    for waypoint in np.atleast_2d(np.asarray(waypoints, dtype=float)):
        for s in np.linspace(0.0, 1.0, steps_per_segment + 1)[1:]:
            q, _ = solve_ik(chain, q, current + s * (waypoint - current), rotation)
            out.append(q)
        current = waypoint
    return np.array(out)
