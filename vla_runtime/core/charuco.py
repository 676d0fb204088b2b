"""ChArUco boards (OpenCV `cv2.aruco`): the board, its printable image, corner detection, camera
intrinsics from many views and the board's pose in one view.

Board frame (OpenCV's): origin at the board's top-left chessboard corner, x along the squares'
columns, y along their rows (down the printed image), z into the board.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import cv2
import numpy as np

# Fewer corners than this fit a pose poorly (and calibrateCamera needs > 4 per view).
MIN_CORNERS = 8
CALIBRATION_FLAGS = cv2.CALIB_FIX_K3 | cv2.CALIB_ZERO_TANGENT_DIST


@dataclass(frozen=True)
class BoardSpec:
    squares_x: int = 7
    squares_y: int = 5
    square_m: float = 0.04
    marker_m: float = 0.03
    dictionary: str = "DICT_5X5_100"
    margin_squares: float = 0.5  # white border of the printed image, in squares

    @cached_property
    def board(self) -> cv2.aruco.CharucoBoard:
        words = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, self.dictionary))
        return cv2.aruco.CharucoBoard(
            (self.squares_x, self.squares_y), self.square_m, self.marker_m, words
        )

    @cached_property
    def detector(self) -> cv2.aruco.CharucoDetector:
        return cv2.aruco.CharucoDetector(self.board)

    @property
    def printed_size_m(self) -> tuple[float, float]:
        """Width and height of the printed image, margin included."""
        margin = 2 * self.margin_squares * self.square_m
        return self.squares_x * self.square_m + margin, self.squares_y * self.square_m + margin

    def image(self, pixels_per_square: int = 100) -> np.ndarray:
        """The printable board (uint8 grey), a white margin of `margin_squares` around it."""
        margin = int(round(self.margin_squares * pixels_per_square))
        size = (
            self.squares_x * pixels_per_square + 2 * margin,
            self.squares_y * pixels_per_square + 2 * margin,
        )
        return self.board.generateImage(size, marginSize=margin, borderBits=1)

    def corner_points(self) -> np.ndarray:
        """All ChArUco corners in the board frame (N, 3), indexed by corner id."""
        return np.asarray(self.board.getChessboardCorners(), dtype=float).reshape(-1, 3)


@dataclass(frozen=True)
class CornerDetection:
    ids: np.ndarray  # (N,) corner ids
    image_points: np.ndarray  # (N, 2) pixels, OpenCV convention (pixel centres on integers)
    object_points: np.ndarray  # (N, 3) metres, board frame


def detect_corners(spec: BoardSpec, image: np.ndarray) -> CornerDetection | None:
    """The board's interpolated ChArUco corners in an RGB or grey image; None when fewer than
    MIN_CORNERS are seen or they lie on one line (no pose, no calibration constraint)."""
    grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY) if image.ndim == 3 else image
    corners, ids, _, _ = spec.detector.detectBoard(grey)
    if ids is None or len(ids) < MIN_CORNERS:
        return None
    ids = ids.reshape(-1)
    if spec.board.checkCharucoCornersCollinear(ids):
        return None
    return CornerDetection(
        ids=ids,
        image_points=corners.reshape(-1, 2).astype(float),
        object_points=spec.corner_points()[ids],
    )


@dataclass(frozen=True)
class Intrinsics:
    width: int
    height: int
    K: np.ndarray  # 3x3
    D: np.ndarray  # plumb_bob k1 k2 p1 p2 k3
    rms_px: float  # reprojection error
    views: int


def calibrate_intrinsics(detections: list[CornerDetection], width: int, height: int) -> Intrinsics:
    """Pinhole K and plumb_bob distortion from the corners of many views (cv2.calibrateCamera)."""
    if len(detections) < 4:
        raise ValueError(f"intrinsics need at least 4 views of the board, got {len(detections)}")
    object_points = [d.object_points.astype(np.float32) for d in detections]
    image_points = [d.image_points.astype(np.float32).reshape(-1, 1, 2) for d in detections]
    # k3 and tangential terms stay zero: with one board at policy resolutions they fit the
    # detector's noise rather than the lens (what ROS's camera_calibration does by default too).
    rms, K, D, _, _ = cv2.calibrateCamera(
        object_points, image_points, (width, height), None, None, flags=CALIBRATION_FLAGS
    )
    return Intrinsics(
        width, height, K, np.asarray(D, float).reshape(-1)[:5], float(rms), len(detections)
    )


def board_pose(detection: CornerDetection, K: np.ndarray, D=None) -> np.ndarray:
    """T_camera_board (4x4, camera optical frame) from one view's corners (solvePnP)."""
    D = np.zeros(5) if D is None else np.asarray(D, float)
    ok, rvec, tvec = cv2.solvePnP(
        detection.object_points, detection.image_points, np.asarray(K, float), D,
        flags=cv2.SOLVEPNP_ITERATIVE,
    )  # fmt: skip
    if not ok:
        raise ValueError("solvePnP found no board pose")
    return transform(cv2.Rodrigues(rvec)[0], tvec.reshape(3))


def transform(rotation: np.ndarray, translation) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = rotation
    out[:3, 3] = np.asarray(translation, float).reshape(3)
    return out
