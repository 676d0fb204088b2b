"""Camera intrinsics and hand-eye calibration in simulation, against MuJoCo's ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.camera_calibration import pinhole_from_fovy, resample_intrinsics
from vla_runtime.core.charuco import board_pose, detect_corners, transform
from vla_runtime.core.hand_eye import (
    EYE_IN_HAND,
    EYE_TO_HAND,
    inverse,
    pose_error,
    solve_ax_xb,
)
from vla_runtime.data.calibrate import sim_hand_eye, sim_intrinsics
from vla_runtime.sim.calibration_scene import CalibrationScene

INTRINSICS_TOLERANCE = 0.01  # relative, of the renderer's K
TRANSLATION_TOLERANCE_M = 0.002
ROTATION_TOLERANCE_DEG = 0.5


def test_the_rendered_board_projects_where_the_ground_truth_says():
    """The board frame, camera frame and K of the calibration scene agree with the rendered
    image to a tenth of a pixel: pixel centres on integers ((w - 1)/2), not w/2."""
    scene = CalibrationScene("free", 320, 240)
    try:
        q = scene.home[:7]
        scene.set_state(q)
        camera = scene.world_camera("scene")
        scene.set_state(q, camera @ transform(np.eye(3), [-0.14, -0.1, 0.6]))
        detection = detect_corners(scene.board, scene.render("scene"))
        truth = inverse(camera) @ scene.world_board()
        K = scene.intrinsics("scene")
    finally:
        scene.close()
    assert detection is not None and len(detection.ids) >= 20
    points = (truth[:3, :3] @ detection.object_points.T).T + truth[:3, 3]
    projected = (K @ points.T).T
    residual = detection.image_points - projected[:, :2] / projected[:, 2:]
    assert np.abs(residual.mean(axis=0)).max() < 0.1
    assert np.abs(residual).max() < 1.0  # single corners: detector noise
    # One frontal view pins the position; its tilt is weakly observed (hence many views).
    translation, _ = pose_error(board_pose(detection, K), truth)
    assert translation < 0.002


def test_resampled_intrinsics_keep_pixel_centres():
    K = pinhole_from_fovy(50.0, 448, 448)
    np.testing.assert_allclose(resample_intrinsics(K, 0.5), pinhole_from_fovy(50.0, 224, 224))


@pytest.mark.parametrize("camera", ["scene", "wrist"])
def test_sim_intrinsics_within_one_percent(camera):
    result = sim_intrinsics(camera, size=224, render_scale=2, views=16, seed=0)
    assert result["views"] >= 12
    errors = result["relative_error"]
    assert max(abs(v) for v in errors.values()) < INTRINSICS_TOLERANCE, errors
    np.testing.assert_allclose(result["truth_K"], pinhole_from_fovy(
        50.0 if camera == "scene" else 75.0, 224, 224))  # fmt: skip


def test_park_martin_recovers_a_known_hand_eye_transform():
    rng = np.random.default_rng(1)
    X = transform(_rotation(rng), rng.normal(size=3) * 0.1)
    A = [transform(_rotation(rng), rng.normal(size=3)) for _ in range(6)]
    B = [inverse(X) @ a @ X for a in A]
    translation, rotation = pose_error(solve_ax_xb(A, B), X)
    assert translation < 1e-9 and rotation < 1e-7


def _rotation(rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q @ np.diag(np.sign(np.diag(r)))
    return q if np.linalg.det(q) > 0 else -q


@pytest.mark.parametrize("kind", [EYE_IN_HAND, EYE_TO_HAND])
def test_sim_hand_eye_within_2mm_and_half_a_degree(kind):
    result = sim_hand_eye(kind, 640, 480, views=14, seed=0)
    assert result["views"] >= 8
    assert result["translation_error_m"] < TRANSLATION_TOLERANCE_M, result
    assert result["rotation_error_deg"] < ROTATION_TOLERANCE_DEG, result
    assert result["parent"] == ("fr3_link8" if kind == EYE_IN_HAND else "fr3_link0")
