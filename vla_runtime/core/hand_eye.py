"""Hand-eye calibration: where a camera is on the arm (eye-in-hand) or beside it (eye-to-hand).

Inputs per view: T_base_flange from forward kinematics of the joint states and the board's
ChArUco corners in the image. OpenCV 5.0's Python bindings lack calibrateHandEye and
calibrateRobotWorldHandEye, so the closed form is Park & Martin's AX = XB solution (what
calibrateHandEye's CALIB_HAND_EYE_PARK computes), refined by least squares on the corners'
reprojection error, which weighs each view by how well its board was actually seen.

- eye-in-hand: the board is fixed in the base frame: X = T_flange_camera,
  Y = T_base_board, and T_camera_board_i = X^-1 A_i^-1 Y.
- eye-to-hand: the board is fixed to the flange: X = T_base_camera, Y = T_flange_board, and
  T_camera_board_i = X^-1 A_i Y.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
from scipy.optimize import least_squares
from scipy.spatial.transform import Rotation

from vla_runtime.core.charuco import CornerDetection, transform

EYE_IN_HAND, EYE_TO_HAND = "eye_in_hand", "eye_to_hand"
KINDS = (EYE_IN_HAND, EYE_TO_HAND)


def inverse(T: np.ndarray) -> np.ndarray:
    R, t = T[:3, :3], T[:3, 3]
    return transform(R.T, -R.T @ t)


def _log(R: np.ndarray) -> np.ndarray:
    return Rotation.from_matrix(R).as_rotvec()


def solve_ax_xb(A: list[np.ndarray], B: list[np.ndarray]) -> np.ndarray:
    """X with A_i X = X B_i for relative motions A_i, B_i (Park & Martin 1994)."""
    alphas = np.array([_log(a[:3, :3]) for a in A])
    betas = np.array([_log(b[:3, :3]) for b in B])
    M = betas.T @ alphas  # sum of beta_i alpha_i^T
    w, V = np.linalg.eigh(M.T @ M)
    if np.min(w) < 1e-12:
        raise ValueError("hand-eye: the motions rotate about too few axes (need two or more)")
    R = V @ np.diag(w**-0.5) @ V.T @ M.T
    lhs = np.vstack([a[:3, :3] - np.eye(3) for a in A])
    rhs = np.concatenate([R @ b[:3, 3] - a[:3, 3] for a, b in zip(A, B, strict=True)])
    t = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
    return transform(R, t)


def _camera_board(kind: str, X: np.ndarray, Y: np.ndarray, base_flange: np.ndarray):
    if kind == EYE_IN_HAND:
        return inverse(X) @ inverse(base_flange) @ Y
    return inverse(X) @ base_flange @ Y


def initial_estimate(
    kind: str, base_flange: list[np.ndarray], camera_board: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """(X, Y) in closed form from the poses of every pair of consecutive views."""
    if kind not in KINDS:
        raise ValueError(f"hand-eye kind must be one of {KINDS}, got {kind!r}")
    if len(base_flange) < 3:
        raise ValueError(f"hand-eye needs at least 3 views, got {len(base_flange)}")
    A, B = [], []
    n = len(base_flange)
    for i in range(n):
        for j in range(i + 1, n):
            Ai, Aj, Bi, Bj = base_flange[i], base_flange[j], camera_board[i], camera_board[j]
            A.append(inverse(Aj) @ Ai if kind == EYE_IN_HAND else Aj @ inverse(Ai))
            B.append(Bj @ inverse(Bi))
    X = solve_ax_xb(A, B)
    # Y from every view (Y = A X B or A^-1 X B), averaged: the mean position, the chordal mean
    # rotation.
    ys = [
        (a @ X @ b) if kind == EYE_IN_HAND else (inverse(a) @ X @ b)
        for a, b in zip(base_flange, camera_board, strict=True)
    ]
    rotation = Rotation.from_matrix([y[:3, :3] for y in ys]).mean().as_matrix()
    return X, transform(rotation, np.mean([y[:3, 3] for y in ys], axis=0))


@dataclass(frozen=True)
class HandEyeResult:
    kind: str
    X: np.ndarray  # eye-in-hand: T_flange_camera; eye-to-hand: T_base_camera
    Y: np.ndarray  # eye-in-hand: T_base_board; eye-to-hand: T_flange_board
    rms_px: float  # corner reprojection error after refinement
    views: int


def _pack(T: np.ndarray) -> np.ndarray:
    return np.concatenate([_log(T[:3, :3]), T[:3, 3]])


def _unpack(p: np.ndarray) -> np.ndarray:
    return transform(Rotation.from_rotvec(p[:3]).as_matrix(), p[3:6])


def calibrate_hand_eye(
    kind: str,
    base_flange: list[np.ndarray],
    detections: list[CornerDetection],
    camera_board: list[np.ndarray],
    K: np.ndarray,
    D=None,
) -> HandEyeResult:
    """X and Y from the views (closed form, then refined on the reprojection error)."""
    X0, Y0 = initial_estimate(kind, base_flange, camera_board)
    K = np.asarray(K, float)
    D = np.zeros(5) if D is None else np.asarray(D, float)

    def residuals(p: np.ndarray) -> np.ndarray:
        X, Y = _unpack(p[:6]), _unpack(p[6:])
        out = []
        for flange, det in zip(base_flange, detections, strict=True):
            T = _camera_board(kind, X, Y, flange)
            rvec = cv2.Rodrigues(T[:3, :3])[0]
            projected, _ = cv2.projectPoints(det.object_points, rvec, T[:3, 3], K, D)
            out.append((projected.reshape(-1, 2) - det.image_points).ravel())
        return np.concatenate(out)

    fit = least_squares(residuals, np.concatenate([_pack(X0), _pack(Y0)]), method="lm")
    rms = float(np.sqrt(np.mean(fit.fun**2)))
    return HandEyeResult(kind, _unpack(fit.x[:6]), _unpack(fit.x[6:]), rms, len(detections))


def pose_error(estimate: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(translation error in metres, rotation error in degrees) between two transforms."""
    delta = inverse(truth) @ estimate
    angle = float(np.degrees(np.linalg.norm(_log(delta[:3, :3]))))
    return float(np.linalg.norm(estimate[:3, 3] - truth[:3, 3])), angle


def quaternion_xyzw(R: np.ndarray) -> list[float]:
    """ROS's quaternion order (x, y, z, w), w >= 0."""
    q = Rotation.from_matrix(R).as_quat()
    return [float(v) for v in (q if q[3] >= 0 else -q)]


def rotation_from_xyzw(q) -> np.ndarray:
    return Rotation.from_quat(np.asarray(q, float)).as_matrix()
