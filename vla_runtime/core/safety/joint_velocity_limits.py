"""Joint velocity limits as the arm's manufacturer library computes them, per joint position.

Models (selected by `velocity_limits:` in config/robots/<robot>.yaml):

- "libfranka_fr3": Franka Research 3. The limit shrinks toward the ends of travel so that the
  joint can still brake before its position limit. Source: libfranka
  include/franka/rate_limiting.h, computeUpperLimitsJointVelocity /
  computeLowerLimitsJointVelocity (libfranka 0.10 to 0.14; later releases read the same numbers
  from the FR3 URDF's position_based_velocity_limits), after
  https://frankaemika.github.io/docs/control_parameters.html#limits-for-franka-research-3.
  Per joint: upper(q) = min(v_max, max(0, -offset + sqrt(max(0, k (q_upper - q))))) - tol,
  lower(q) = max(-v_max, min(0, offset - sqrt(max(0, k (q - q_lower))))) + tol,
  with k = 2 * deceleration and tol = kJointVelocityLimitsTolerance (kLimitEps, as FR3 counts
  no lost packets).
- "libfranka_fer": Franka Emika Robot (Panda). Flat limits: libfranka 0.9.2
  include/franka/rate_limiting.h kMaxJointVelocity = v_max - kLimitEps - 3 kDeltaT a_max
  (the margin for three lost packets, kTolNumberPacketsLost = 3, at the joint's
  kMaxJointAcceleration = a_max - kLimitEps).

Universal Robots publish no position-dependent model: robots without one use their flat
`limits.velocity`.
"""

from __future__ import annotations

import numpy as np

LIBFRANKA_LIMIT_EPS = 1e-3  # kLimitEps (rad/s): libfranka's margin under every limit
LIBFRANKA_DELTA_T = 1e-3  # kDeltaT (s): the FCI's control period
# kJointVelocityLimitsTolerance for the FR3 (rad/s, every joint): kLimitEps plus
# kTolNumberPacketsLost (0 on FR3) * kDeltaT * kMaxJointAcceleration.
FR3_VELOCITY_TOLERANCE = LIBFRANKA_LIMIT_EPS

# FR3, per joint: the velocity cap (rad/s), the offset subtracted after the square root (rad/s),
# the factor under the root (2 * deceleration, rad/s^2) and the positions where the upper and
# the lower limit reach zero (rad; the constants libfranka uses, a hair beyond the URDF's range).
_FR3_CAP = np.array([2.62, 2.62, 2.62, 2.62, 5.26, 4.18, 5.26])
_FR3_OFFSET = np.array([0.30, 0.20, 0.20, 0.30, 0.35, 0.35, 0.35])
_FR3_FACTOR = np.array([12.0, 5.17, 7.00, 8.00, 34.0, 11.0, 34.0])
_FR3_UPPER_END = np.array([2.75010, 1.79180, 2.90650, -0.1458, 2.81010, 4.52050, 3.01960])
_FR3_LOWER_END = np.array([-2.75010, -1.79180, -2.90650, -3.04810, -2.81010, 0.54092, -3.01960])

# FER (Panda), libfranka 0.9.2: nominal velocity and acceleration limits, three lost packets.
_FER_PACKETS_LOST = 3.0
_FER_NOMINAL_VELOCITY = np.array([2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61])
_FER_ACCELERATION = np.array([15.0, 7.5, 10.0, 12.5, 15.0, 20.0, 20.0]) - LIBFRANKA_LIMIT_EPS
_FER_VELOCITY = (
    _FER_NOMINAL_VELOCITY
    - LIBFRANKA_LIMIT_EPS
    - _FER_PACKETS_LOST * LIBFRANKA_DELTA_T * _FER_ACCELERATION
)

MODELS = ("libfranka_fr3", "libfranka_fer")


def check_model(model: str) -> str:
    """`model`, or a ValueError naming the known ones."""
    if model not in MODELS:
        raise ValueError(f"unknown velocity limit model {model!r} (known: {', '.join(MODELS)})")
    return model


def velocity_limits(model: str, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lower <= 0, upper >= 0) joint velocity limits in rad/s at joint positions `q` (shape
    (..., 7), any leading shape), as the manufacturer's library computes them."""
    check_model(model)
    q = np.asarray(q, dtype=float)
    if q.shape[-1:] != (7,):
        raise ValueError(f"{model} describes 7 joints, got positions of shape {q.shape}")
    if model == "libfranka_fer":
        upper = np.broadcast_to(_FER_VELOCITY, q.shape).copy()
        return -upper, upper
    room_up = np.sqrt(np.maximum(0.0, _FR3_FACTOR * (_FR3_UPPER_END - q)))
    room_down = np.sqrt(np.maximum(0.0, _FR3_FACTOR * (q - _FR3_LOWER_END)))
    upper = np.minimum(_FR3_CAP, np.maximum(0.0, room_up - _FR3_OFFSET)) - FR3_VELOCITY_TOLERANCE
    lower = np.maximum(-_FR3_CAP, np.minimum(0.0, _FR3_OFFSET - room_down)) + FR3_VELOCITY_TOLERANCE
    # At the very end of travel libfranka's limit goes tol past zero; a limit never points the
    # other way here (the gate reads "upper" as how fast it may move up, never as a push down).
    return np.minimum(lower, 0.0), np.maximum(upper, 0.0)
