"""A camera's intrinsic calibration (the content of sensor_msgs/CameraInfo), kept consistent
with the size of the image it is published with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def pinhole_from_fovy(fovy_deg: float, width: int, height: int) -> np.ndarray:
    """K of an OpenGL (MuJoCo) camera with vertical field of view fovy and square pixels, in
    the OpenCV / ROS pixel convention (pixel centres on integers): OpenGL puts the optical axis
    at the image centre, w/2 from the image edge, which is pixel coordinate (w - 1)/2."""
    f = 0.5 * height / math.tan(math.radians(fovy_deg) / 2.0)
    return np.array([[f, 0.0, (width - 1) / 2.0], [0.0, f, (height - 1) / 2.0], [0.0, 0.0, 1.0]])


def resample_intrinsics(matrix: np.ndarray, scale: float) -> np.ndarray:
    """K of the same camera rendered (or resized) `scale` times as large in both directions,
    pixel centres kept on integers: x' = (x + 0.5) * scale - 0.5."""
    K = np.array(matrix, dtype=float, copy=True)
    K[0, 0], K[1, 1] = K[0, 0] * scale, K[1, 1] * scale
    K[0, 1] *= scale
    K[0, 2], K[1, 2] = (K[0, 2] + 0.5) * scale - 0.5, (K[1, 2] + 0.5) * scale - 0.5
    return K


def scale_intrinsics(matrix: np.ndarray, src: tuple[int, int], dst: tuple[int, int]) -> np.ndarray:
    """Scale a 3x3 K (or 3x4 P) from an image of size src=(w, h) to dst=(w, h).

    Rows 0 and 1 scale by the width and height ratios, the convention of ROS image_proc's
    resize, so published CameraInfo matches what ROS tools expect."""
    scaled = np.array(matrix, dtype=float, copy=True)
    scaled[0, :] *= dst[0] / src[0]
    scaled[1, :] *= dst[1] / src[1]
    return scaled


@dataclass
class CameraCalibration:
    width: int
    height: int
    K: np.ndarray  # 3x3
    D: list[float] = field(default_factory=list)
    R: np.ndarray = field(default_factory=lambda: np.eye(3))
    P: np.ndarray | None = None  # 3x4; [K | 0] when not given
    distortion_model: str = "plumb_bob"
    camera_name: str = ""

    def __post_init__(self) -> None:
        self.K = np.asarray(self.K, dtype=float).reshape(3, 3)
        self.R = np.asarray(self.R, dtype=float).reshape(3, 3)
        if self.P is None:
            self.P = np.hstack([self.K, np.zeros((3, 1))])
        self.P = np.asarray(self.P, dtype=float).reshape(3, 4)

    @classmethod
    def uncalibrated(cls, width: int, height: int) -> CameraCalibration:
        """What ROS publishes for an uncalibrated camera: K, R and P all zeros, no distortion."""
        return cls(width, height, K=np.zeros((3, 3)), R=np.zeros((3, 3)), P=np.zeros((3, 4)))

    def scaled_to(self, width: int, height: int) -> CameraCalibration:
        """The same calibration for the image resized to width x height."""
        src, dst = (self.width, self.height), (width, height)
        return CameraCalibration(
            width=width,
            height=height,
            K=scale_intrinsics(self.K, src, dst),
            D=list(self.D),
            R=self.R.copy(),
            P=scale_intrinsics(self.P, src, dst),
            distortion_model=self.distortion_model,
            camera_name=self.camera_name,
        )


def published_calibration(
    width: int,
    height: int,
    calibration: CameraCalibration | None = None,
    K: np.ndarray | None = None,
) -> CameraCalibration:
    """The calibration of a width x height image: a calibration file's, scaled to the image;
    else the intrinsics K of the renderer that drew it at that size; else uncalibrated."""
    if calibration is not None:
        return calibration.scaled_to(width, height)
    if K is not None:
        return CameraCalibration(width, height, K=K)
    return CameraCalibration.uncalibrated(width, height)
