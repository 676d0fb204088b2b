"""Cube localisation from one calibrated camera, on synthetic images of known cubes: the
silhouette-matching estimate, its uncertainty, occlusion, fusion and the yaw from above."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from vla_runtime.core.camera_calibration import CameraCalibration, pinhole_from_fovy
from vla_runtime.core.cube_perception import (
    Camera,
    Sighting,
    blob_pixels_near,
    colour_mask,
    cube_corners,
    fuse,
    hue_deg,
    sightings,
    to_hsv,
)

SIZE = 0.04
RED = (217, 26, 26)
TABLE = (136, 104, 72)


def look_at(position, target) -> np.ndarray:
    """T_world_optical of a camera at `position` looking at `target` (optical: z forward)."""
    z = np.asarray(target, float) - np.asarray(position, float)
    z /= np.linalg.norm(z)
    x = np.cross(z, [0.0, 0.0, 1.0])
    if np.linalg.norm(x) < 1e-6:  # straight down
        x = np.array([0.0, -1.0, 0.0])
    x /= np.linalg.norm(x)
    pose = np.eye(4)
    pose[:3, :3] = np.column_stack([x, np.cross(z, x), z])
    pose[:3, 3] = position
    return pose


def camera(position, target, size=224, fovy=50.0) -> Camera:
    K = pinhole_from_fovy(fovy, size, size)
    return Camera(CameraCalibration(size, size, K=K), look_at(position, target))


def draw(cam: Camera, cubes: dict[tuple, np.ndarray], yaw: float = 0.3) -> np.ndarray:
    """A table-coloured image with each cube's silhouette filled in its colour."""
    image = np.zeros((cam.height, cam.width, 3), np.uint8)
    image[:] = TABLE
    for colour, centre in cubes.items():
        pixels = cam.project(cube_corners(centre, SIZE, yaw))
        hull = cv2.convexHull(np.round(pixels * 16).astype(np.int32))
        cv2.fillConvexPoly(image, hull, colour, lineType=cv2.LINE_8, shift=4)
    return image


SCENE = ((1.3, 0.6, 0.95), (0.35, 0.0, 0.28))  # the workcell's scene camera


@pytest.mark.parametrize("xy", [(0.45, -0.1), (0.55, 0.15), (0.40, 0.05)])
def test_a_resting_cube_is_located_within_two_millimetres(xy):
    cam = camera(*SCENE)
    centre = np.array([*xy, SIZE / 2])
    found = sightings(draw(cam, {RED: centre}), cam, "scene", {"red": hue_deg(RED)}, SIZE)
    sighting = found["red"]
    # The blob's own centroid sits toward the camera: the naive ray-plane point is a
    # centimetre off; matching the silhouette removes that.
    assert np.linalg.norm(sighting.position[:2] - centre[:2]) < 0.002
    assert sighting.position[2] == pytest.approx(SIZE / 2)
    assert 0.0005 < sighting.sigma_m < 0.006
    assert sighting.visible_fraction > 0.9


def test_an_occluded_cube_is_less_certain_and_a_mostly_hidden_one_is_dropped():
    cam = camera(*SCENE)
    centre = np.array([0.5, 0.0, SIZE / 2])
    image = draw(cam, {RED: centre})
    clear = sightings(image, cam, "scene", {"red": hue_deg(RED)}, SIZE)["red"]
    ys, xs = np.nonzero(colour_mask(to_hsv(image), hue_deg(RED)))
    half = image.copy()
    half[:, : int(np.median(xs))] = TABLE  # the left half hidden
    occluded = sightings(half, cam, "scene", {"red": hue_deg(RED)}, SIZE)["red"]
    assert occluded.visible_fraction < 0.75
    assert occluded.sigma_m > 2 * clear.sigma_m
    sliver = image.copy()
    sliver[:, : int(np.percentile(xs, 85))] = TABLE
    assert "red" not in sightings(sliver, cam, "scene", {"red": hue_deg(RED)}, SIZE)


def test_the_table_and_grey_metal_are_not_taken_for_a_cube():
    image = np.zeros((50, 50, 3), np.uint8)
    image[:25] = TABLE
    image[25:] = (180, 180, 185)
    for colour in ((217, 26, 26), (26, 178, 51), (26, 64, 217)):
        assert not colour_mask(to_hsv(image), hue_deg(colour)).any()


def test_fusion_weights_each_sighting_by_its_covariance():
    sharp = Sighting("red", "wrist", np.array([0.5, 0.0, 0.02]), np.eye(2) * 1e-6, 400, 1.0)
    blurry = Sighting("red", "scene", np.array([0.51, 0.0, 0.02]), np.eye(2) * 1e-4, 20, 1.0)
    position, covariance = fuse([sharp, blurry])
    assert position[0] == pytest.approx(0.5 + 0.01 / 101, abs=1e-6)
    assert covariance[0, 0] == pytest.approx(1 / (1e6 + 1e4))


@pytest.mark.parametrize("yaw_deg", [0.0, 12.0, 30.0, -40.0])
def test_the_yaw_is_read_from_a_view_from_above(yaw_deg):
    # 15 cm above: the wrist camera during the descent (from 25 cm the cube is ~12 px wide and
    # the yaw only good to ~5 degrees).
    cam = camera((0.5, 0.0, 0.15), (0.5, 0.0, 0.0), size=96, fovy=75.0)
    centre = np.array([0.5, 0.01, SIZE / 2])
    image = draw(cam, {RED: centre}, yaw=math.radians(yaw_deg))
    found = sightings(image, cam, "wrist", {"red": hue_deg(RED)}, SIZE, with_yaw=True)["red"]
    error = (found.yaw - math.radians(yaw_deg) + math.pi / 4) % (math.pi / 2) - math.pi / 4
    assert abs(math.degrees(error)) < 2.5
    assert np.linalg.norm(found.position[:2] - centre[:2]) < 0.002


def test_pixels_near_a_point_count_only_that_colour_there():
    cam = camera(*SCENE)
    centre = np.array([0.5, 0.0, SIZE / 2])
    image = draw(cam, {RED: centre})
    near = blob_pixels_near(image, hue_deg(RED), cam, centre, 10.0)
    far = blob_pixels_near(image, hue_deg(RED), cam, centre + [0.2, 0.2, 0.0], 10.0)
    assert near > 20 and far == 0
