"""Camera calibrations: intrinsics scaled with the image, and the calibration a frame is
published with."""

import numpy as np

from vla_runtime.core.camera_calibration import (
    CameraCalibration,
    published_calibration,
    scale_intrinsics,
)


def test_scale_intrinsics():
    K = np.array([[600.0, 0.0, 320.0], [0.0, 500.0, 240.0], [0.0, 0.0, 1.0]])
    scaled = scale_intrinsics(K, (640, 480), (320, 120))
    np.testing.assert_allclose(scaled, [[300.0, 0.0, 160.0], [0.0, 125.0, 60.0], [0, 0, 1]])
    assert K[0, 0] == 600.0  # input untouched


def test_uncalibrated_has_zero_intrinsics():
    calib = CameraCalibration.uncalibrated(224, 160)
    assert (calib.width, calib.height) == (224, 160)
    assert not calib.K.any() and not calib.P.any() and calib.D == []


def test_a_calibration_file_is_scaled_to_the_published_image():
    K = [[600.0, 0.0, 320.0], [0.0, 500.0, 240.0], [0.0, 0.0, 1.0]]
    calib = CameraCalibration(640, 480, K=K, D=[0.1, 0.0, 0.0, 0.0, 0.0])
    published = published_calibration(320, 240, calib, K=np.eye(3))  # the file wins
    assert (published.width, published.height) == (320, 240)
    np.testing.assert_allclose(published.K, [[300.0, 0, 160.0], [0, 250.0, 120.0], [0, 0, 1]])
    np.testing.assert_allclose(published.P[:, :3], published.K)
    assert published.D == [0.1, 0.0, 0.0, 0.0, 0.0]


def test_without_a_file_a_renderer_intrinsics_or_nothing():
    K = np.array([[100.0, 0, 16], [0, 100.0, 12], [0, 0, 1]])
    rendered = published_calibration(32, 24, K=K)
    np.testing.assert_array_equal(rendered.K, K)
    np.testing.assert_array_equal(rendered.P, np.hstack([K, np.zeros((3, 1))]))
    np.testing.assert_array_equal(rendered.R, np.eye(3))
    uncalibrated = published_calibration(32, 24)
    assert (uncalibrated.width, uncalibrated.height) == (32, 24)
    assert not uncalibrated.K.any() and not uncalibrated.R.any() and not uncalibrated.P.any()
