"""The calibration results on disk, in the formats ROS users expect.

- `<camera>.yaml`: camera_calibration_parsers' camera_info YAML (what camera_info_manager and
  `ros2 run camera_calibration cameracalibrator` write), read back by drivers/cameras.py.
- `<camera>_extrinsics.yaml`: one static transform, parent -> child, translation in metres and
  rotation as a quaternion (x, y, z, w), as `ros2 run tf2_ros static_transform_publisher` takes.
- `latency.yaml`: measured latencies (s) and the stack parameters derived from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from vla_runtime.core.camera_calibration import CameraCalibration


def _matrix(values: np.ndarray) -> dict:
    values = np.asarray(values, dtype=float)
    rows, cols = values.shape if values.ndim == 2 else (1, values.size)
    return {"rows": rows, "cols": cols, "data": [round(float(v), 9) for v in values.ravel()]}


def camera_info_yaml(calibration: CameraCalibration) -> str:
    doc = {
        "image_width": int(calibration.width),
        "image_height": int(calibration.height),
        "camera_name": calibration.camera_name,
        "camera_matrix": _matrix(calibration.K),
        "distortion_model": calibration.distortion_model,
        "distortion_coefficients": _matrix(np.asarray(calibration.D, float).reshape(1, -1)),
        "rectification_matrix": _matrix(calibration.R),
        "projection_matrix": _matrix(calibration.P),
    }
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


@dataclass(frozen=True)
class StaticTransform:
    parent: str
    child: str
    translation: tuple[float, float, float]  # m
    rotation: tuple[float, float, float, float]  # quaternion x, y, z, w

    def to_yaml(self, comment: str = "") -> str:
        doc = {
            "parent": self.parent,
            "child": self.child,
            "translation": [round(float(v), 9) for v in self.translation],
            "rotation": [round(float(v), 9) for v in self.rotation],
        }
        head = "".join(f"# {line}\n" for line in comment.splitlines())
        return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def load_static_transform(path: str | Path) -> StaticTransform:
    """Read `<camera>_extrinsics.yaml`; ValueError when it is malformed."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping with parent, child, translation, rotation")
    try:
        translation = tuple(float(v) for v in doc["translation"])
        rotation = tuple(float(v) for v in doc["rotation"])
        parent, child = str(doc["parent"]), str(doc["child"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: needs parent, child, translation [x, y, z], "
                         f"rotation [x, y, z, w]: {exc}") from exc  # fmt: skip
    if len(translation) != 3 or len(rotation) != 4 or not parent or not child:
        raise ValueError(f"{path}: translation needs 3 values, rotation 4, frames names")
    norm = math.sqrt(sum(v * v for v in rotation))
    if not all(map(math.isfinite, translation)) or not abs(norm - 1.0) < 1e-3:
        raise ValueError(f"{path}: translation must be finite and rotation a unit quaternion")
    return StaticTransform(parent, child, translation, tuple(v / norm for v in rotation))


def latency_yaml(doc: dict) -> str:
    head = "# Measured by `vla-runtime calibrate latency`; seconds.\n"
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def load_latency(path: str | Path) -> dict:
    doc = yaml.safe_load(Path(path).read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping")
    return doc
