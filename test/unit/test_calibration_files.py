"""Calibration results on disk: camera_info YAML, static transforms, latency figures."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.calibration_files import (
    StaticTransform,
    camera_info_yaml,
    load_static_transform,
)
from vla_runtime.core.camera_calibration import CameraCalibration, pinhole_from_fovy
from vla_runtime.core.latency import (
    LatencyMeasurement,
    match_receipts,
    motion_onset,
    stack_parameters,
    summary,
)
from vla_runtime.drivers.cameras import load_calibration


def test_camera_info_yaml_reads_back_with_the_ros_loader(tmp_path):
    K = pinhole_from_fovy(50.0, 224, 224)
    written = CameraCalibration(224, 224, K=K, D=[0.01, -0.02, 0, 0, 0], camera_name="scene")
    path = tmp_path / "scene.yaml"
    path.write_text(camera_info_yaml(written))
    text = path.read_text()
    for key in ("image_width", "camera_matrix", "distortion_model", "projection_matrix"):
        assert key in text
    read = load_calibration(path)
    np.testing.assert_allclose(read.K, K)
    np.testing.assert_allclose(read.P[:, :3], K)
    assert read.D == pytest.approx([0.01, -0.02, 0, 0, 0]) and read.camera_name == "scene"


def test_static_transform_round_trip_and_refusals(tmp_path):
    path = tmp_path / "wrist_extrinsics.yaml"
    written = StaticTransform("fr3_link8", "wrist_optical_frame", (0.1, 0.0, 0.02), (0, 0, 0, 1))
    path.write_text(written.to_yaml("eye-in-hand"))
    assert load_static_transform(path) == written
    path.write_text("parent: a\nchild: b\ntranslation: [0, 0, 0]\nrotation: [0, 0, 0, 2]\n")
    with pytest.raises(ValueError, match="unit quaternion"):
        load_static_transform(path)
    path.write_text("parent: a\n")
    with pytest.raises(ValueError, match="needs parent"):
        load_static_transform(path)


def test_latency_matching_and_onsets():
    receipts = {0.02: 10.0, 0.04: 10.02, 0.06: 10.04}
    frames = [(0.02, 10.031), (0.06, 10.071), (0.05, 11.0)]  # the last shows no known state
    assert match_receipts(receipts, frames) == pytest.approx([0.031, 0.031])
    q0 = np.zeros(2)
    values = [[0, 0], [0, 1e-5], [0, 3e-4], [0, 1e-2]]
    assert motion_onset([0.0, 0.01, 0.02, 0.03], values, q0, 2e-4) == 0.02
    assert motion_onset([0.0], [[0, 0]], q0, 2e-4) is None


def test_stack_parameters_from_a_measurement():
    measured = LatencyMeasurement(
        cameras={"scene": summary([0.05, 0.06, 0.07]), "wrist": summary([0.01, 0.01, 0.02])},
        command_to_motion=summary([0.012, 0.014, 0.016]),
        command_to_image_motion={},
    )
    arguments = stack_parameters(measured)
    assert arguments["driver_delay_s"] == pytest.approx(0.014)
    assert arguments["max_observation_age_s"] == pytest.approx(1.0 + 0.069, abs=1e-3)
