"""Locating the coloured cubes from calibrated cameras: colour segmentation, the pixel ray
intersected with the table, a position uncertainty, and the fusion of every camera's sightings.

A cube's visible blob is its silhouette (top face and the sides that face the camera), whose
centroid is not the projection of the cube's centre: seen obliquely from a scene camera it lies
toward the camera by up to half a cube. So the estimate is the resting cube whose projected
silhouette has the observed centroid: start where the centroid's ray meets the plane of cube
centres, project the model cube's eight corners from there, and move the estimate by the
centroid difference through the local pixel-to-table Jacobian (three iterations converge to
well under a millimetre). The uncertainty is the centroid's pixel noise carried through the same
Jacobian, inflated when the blob is smaller than the model's silhouette (partly occluded or cut
by the image border).

Pure numpy/OpenCV, no ROS: the collector's perception node and the tests share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from vla_runtime.core.camera_calibration import CameraCalibration

MIN_PIXELS = 4  # a blob smaller than this is noise, not a cube
SATURATION_MIN = 0.55  # the table's brown is 0.47: cubes are saturated, wood and metal are not
VALUE_MIN = 0.12
HUE_TOLERANCE_DEG = 14.0
# Centroid noise of a blob (px, 1 sigma): quantisation of a few-pixel silhouette dominates.
CENTROID_NOISE_PX = 0.35
# A sighting whose blob covers less of the model silhouette than this is occluded too much to
# locate the cube (a finger across it, the image border).
MIN_VISIBLE_FRACTION = 0.35
# A yaw is read only from a blob this large (a close view): a few-pixel blob's outline says
# nothing about the cube's edges.
YAW_MIN_PIXELS = 100
YAW_SAMPLES = (0.0, math.pi / 8, math.pi / 4, 3 * math.pi / 8)  # the silhouette's yaw is unknown


def hue_deg(rgb) -> float:
    r, g, b = (float(v) for v in rgb[:3])
    hsv = cv2.cvtColor(np.array([[[r, g, b]]], np.float32), cv2.COLOR_RGB2HSV)
    return float(hsv[0, 0, 0])


def colour_mask(hsv: np.ndarray, hue: float) -> np.ndarray:
    """Pixels of `hue` (degrees) in an HSV float image (H in degrees, S and V in 0..1)."""
    difference = np.abs((hsv[..., 0] - hue + 180.0) % 360.0 - 180.0)
    return (
        (difference <= HUE_TOLERANCE_DEG)
        & (hsv[..., 1] >= SATURATION_MIN)
        & (hsv[..., 2] >= VALUE_MIN)
    )  # fmt: skip


def to_hsv(image: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(np.asarray(image, np.float32) / 255.0, cv2.COLOR_RGB2HSV)


@dataclass(frozen=True)
class Blob:
    centroid: np.ndarray  # (u, v) px, distortion removed
    pixels: int
    touches_border: bool


def largest_blob(mask: np.ndarray) -> Blob | None:
    found = largest_region(mask)
    return None if found is None else found[0]


def largest_region(mask: np.ndarray) -> tuple[Blob, np.ndarray] | None:
    """The largest connected region of `mask` (raw pixel coordinates)."""
    count, labels, stats, centroids = cv2.connectedComponentsWithStats(
        mask.astype(np.uint8), connectivity=8
    )
    if count <= 1:
        return None
    best = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    area = int(stats[best, cv2.CC_STAT_AREA])
    if area < MIN_PIXELS:
        return None
    x, y, w, h = (int(stats[best, k]) for k in range(4))
    height, width = mask.shape
    border = x == 0 or y == 0 or x + w >= width or y + h >= height
    return Blob(np.asarray(centroids[best], float), area, border), labels == best


class Camera:
    """A calibrated pinhole camera at a pose: `world_camera` is T_world_optical (z forward,
    y down), K and distortion at the image's own size."""

    def __init__(self, calibration: CameraCalibration, world_camera: np.ndarray):
        self.calibration = calibration
        self.K = np.asarray(calibration.K, float)
        self.D = np.asarray(calibration.D or [0.0] * 5, float)
        self.pose = np.asarray(world_camera, float)
        self.width, self.height = int(calibration.width), int(calibration.height)

    @property
    def origin(self) -> np.ndarray:
        return self.pose[:3, 3]

    def undistort(self, pixels: np.ndarray) -> np.ndarray:
        """Raw pixels -> pixels of the distortion-free pinhole with the same K."""
        points = np.asarray(pixels, np.float64).reshape(-1, 1, 2)
        return cv2.undistortPoints(points, self.K, self.D, P=self.K).reshape(-1, 2)

    def project(self, points: np.ndarray) -> np.ndarray:
        """World points (N, 3) -> distortion-free pixels (N, 2); NaN behind the camera."""
        camera_world = np.linalg.inv(self.pose)
        p = (camera_world[:3, :3] @ np.asarray(points, float).T).T + camera_world[:3, 3]
        z = np.where(p[:, 2] > 1e-6, p[:, 2], np.nan)
        return np.stack([self.K[0, 0] * p[:, 0] / z + self.K[0, 2],
                         self.K[1, 1] * p[:, 1] / z + self.K[1, 2]], axis=1)  # fmt: skip

    def ray(self, pixel: np.ndarray) -> np.ndarray:
        """World direction (unit) of a distortion-free pixel."""
        u, v = pixel
        d = np.array([(u - self.K[0, 2]) / self.K[0, 0], (v - self.K[1, 2]) / self.K[1, 1], 1.0])
        d = self.pose[:3, :3] @ d
        return d / np.linalg.norm(d)

    def on_plane(self, pixel: np.ndarray, z: float) -> np.ndarray | None:
        """Where the ray of `pixel` meets the horizontal plane at height z (None: never)."""
        d = self.ray(pixel)
        if abs(d[2]) < 1e-6:
            return None
        t = (z - self.origin[2]) / d[2]
        return None if t <= 0 else self.origin + t * d


def cube_corners(centre: np.ndarray, size: float, yaw: float) -> np.ndarray:
    h = size / 2
    c, s = math.cos(yaw), math.sin(yaw)
    corners = []
    for dx in (-h, h):
        for dy in (-h, h):
            for dz in (-h, h):
                corners.append([centre[0] + c * dx - s * dy, centre[1] + s * dx + c * dy,
                                centre[2] + dz])  # fmt: skip
    return np.array(corners)


def silhouette(camera: Camera, centre: np.ndarray, size: float) -> tuple[np.ndarray, float]:
    """Centroid (px) and area (px^2) of a resting cube's projected silhouette, averaged over
    yaw (which moves the centroid by a small fraction of a pixel)."""
    centroids, areas = [], []
    for yaw in YAW_SAMPLES:
        pixels = camera.project(cube_corners(centre, size, yaw))
        if not np.all(np.isfinite(pixels)):
            return np.array([np.nan, np.nan]), 0.0
        hull = cv2.convexHull(pixels.astype(np.float32))
        moments = cv2.moments(hull)
        if moments["m00"] <= 0:
            return np.array([np.nan, np.nan]), 0.0
        centroids.append([moments["m10"] / moments["m00"], moments["m01"] / moments["m00"]])
        areas.append(moments["m00"])
    return np.mean(centroids, axis=0), float(np.mean(areas))


@dataclass(frozen=True)
class Sighting:
    """One camera's estimate of a resting cube's centre, with its 2x2 covariance on the table."""

    colour: str
    camera: str
    position: np.ndarray  # world xyz (z = the resting centre's height)
    covariance: np.ndarray  # 2x2, m^2, of x and y
    pixels: int
    visible_fraction: float
    stamp: float = 0.0
    yaw: float | None = None  # modulo 90 degrees; only from a camera looking down on it

    @property
    def sigma_m(self) -> float:
        """The larger axis of the 1-sigma ellipse."""
        return float(math.sqrt(max(np.linalg.eigvalsh(self.covariance).max(), 0.0)))


def _table_jacobian(camera: Camera, pixel: np.ndarray, z: float) -> np.ndarray | None:
    """d(table xy)/d(pixel) at `pixel` on the plane z, by central differences."""
    columns = []
    for offset in ((0.5, 0.0), (0.0, 0.5)):
        ahead = camera.on_plane(pixel + offset, z)
        behind = camera.on_plane(pixel - np.array(offset), z)
        if ahead is None or behind is None:
            return None
        columns.append(ahead[:2] - behind[:2])
    return np.column_stack(columns)


def locate(camera: Camera, blob: Blob, size: float, resting_z: float) -> tuple | None:
    """The resting cube centre (xyz) whose silhouette centroid is the blob's, its table
    covariance and the visible fraction of the silhouette; None when it cannot be placed."""
    observed = camera.undistort(blob.centroid)[0]
    guess = camera.on_plane(observed, resting_z)
    if guess is None:
        return None
    centre = guess.copy()
    area = 0.0
    for _ in range(4):
        predicted, area = silhouette(camera, centre, size)
        jacobian = _table_jacobian(camera, predicted, resting_z)
        if jacobian is None or not np.all(np.isfinite(predicted)):
            return None
        step = jacobian @ (observed - predicted)
        centre[:2] += step
        if np.linalg.norm(step) < 1e-5:
            break
    jacobian = _table_jacobian(camera, observed, resting_z)
    if jacobian is None or area <= 0:
        return None
    visible = min(blob.pixels / area, 1.0)
    # Centroid noise grows as the blob shrinks, and an occluded blob's centroid is off by up to
    # the missing part's extent (half the silhouette's width when half of it is hidden).
    noise = CENTROID_NOISE_PX * max(1.0, 3.0 / math.sqrt(blob.pixels))
    occlusion = (1.0 - visible) * 0.5 * math.sqrt(area)
    sigma_px = math.hypot(noise, occlusion)
    covariance = jacobian @ jacobian.T * sigma_px**2
    return centre, covariance, visible


def sightings(
    image: np.ndarray,
    camera: Camera,
    camera_name: str,
    hues: dict[str, float],
    size: float,
    stamp: float = 0.0,
    with_yaw: bool = False,
) -> dict[str, Sighting]:
    """Every cube colour of `hues` that `camera` sees in `image`, located on the table (and
    its yaw, `with_yaw`, for a camera looking down on the cubes)."""
    hsv = to_hsv(image)
    found = {}
    for colour, hue in hues.items():
        region = largest_region(colour_mask(hsv, hue))
        if region is None:
            continue
        blob, pixels = region
        placed = locate(camera, blob, size, size / 2)
        if placed is None:
            continue
        centre, covariance, visible = placed
        if visible < MIN_VISIBLE_FRACTION or blob.touches_border:
            continue
        close = visible > 0.9 and blob.pixels >= YAW_MIN_PIXELS
        yaw = top_yaw(pixels, camera, size) if with_yaw and close else None
        found[colour] = Sighting(colour, camera_name, centre, covariance, blob.pixels, visible,
                                 stamp, yaw)  # fmt: skip
    return found


def top_yaw(region: np.ndarray, camera: Camera, size: float) -> float | None:
    """The cube's yaw (modulo 90 degrees, in [-45, 45)) from its blob seen from above: the
    blob's outline projected onto the plane of the top face, whose smallest enclosing
    rectangle is the face's square (the sides seen at a slant widen it a little)."""
    contours, _ = cv2.findContours(region.astype(np.uint8), cv2.RETR_EXTERNAL,
                                   cv2.CHAIN_APPROX_NONE)  # fmt: skip
    if not contours:
        return None
    outline = camera.undistort(max(contours, key=len).reshape(-1, 2).astype(float))
    points = [camera.on_plane(p, size) for p in outline]
    if any(p is None for p in points) or len(points) < 4:
        return None
    xy = np.array([p[:2] for p in points], np.float32)
    (_, _), (_, _), angle = cv2.minAreaRect(xy)
    quarter = math.pi / 2
    return (math.radians(angle) + quarter / 2) % quarter - quarter / 2


def fuse(estimates: list[Sighting]) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-covariance fusion of sightings of one cube: (xyz, 2x2 covariance)."""
    information = np.zeros((2, 2))
    weighted = np.zeros(2)
    for s in estimates:
        inverse = np.linalg.inv(s.covariance + np.eye(2) * 1e-12)
        information += inverse
        weighted += inverse @ s.position[:2]
    covariance = np.linalg.inv(information)
    xy = covariance @ weighted
    return np.array([xy[0], xy[1], estimates[0].position[2]]), covariance


def blob_pixels_near(image: np.ndarray, hue: float, camera: Camera, point: np.ndarray,
                     radius_px: float) -> int:  # fmt: skip
    """Pixels of `hue` within `radius_px` of where `point` projects (0: out of view)."""
    pixel = camera.project(np.asarray(point, float)[None])[0]
    if not np.all(np.isfinite(pixel)):
        return 0
    mask = colour_mask(to_hsv(image), hue)
    ys, xs = np.nonzero(mask)
    if xs.size == 0:
        return 0
    near = np.hypot(xs - pixel[0], ys - pixel[1]) <= radius_px
    return int(near.sum())
