"""Image-space change per camera: thumbnails and mean absolute difference, exact numbers."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.scene_change import SceneChange, change, thumbnail


def test_thumbnail_block_means_grey():
    image = np.zeros((4, 6, 3), np.uint8)
    image[:2, :2] = (255, 0, 0)  # pure red: luma 0.299
    image[2:, 4:] = 255  # white
    thumb = thumbnail(image, size=2)  # block 2 -> 2x3
    expected = np.array([[0.299, 0.0, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(thumb, expected, atol=1e-6)
    # rows/columns that do not fill a block are cropped; grey input is accepted
    assert thumbnail(np.zeros((5, 7), np.uint8), size=2).shape == (2, 3)
    assert thumbnail(np.zeros((224, 224, 3), np.uint8)).shape == (32, 32)
    with pytest.raises(ValueError):
        thumbnail(np.zeros((2, 2, 2, 3), np.uint8))


def test_change_is_mean_absolute_difference():
    a = np.zeros((2, 2))
    b = np.array([[1.0, 0.0], [0.5, 0.0]])
    assert change(a, b) == pytest.approx(0.375)
    assert change(b, b) == 0.0
    with pytest.raises(ValueError):
        change(a, np.zeros((3, 3)))


def test_small_noise_is_averaged_away_but_a_moving_object_is_not():
    rng = np.random.default_rng(0)
    base = np.full((224, 224, 3), 120, np.uint8)
    noisy = np.clip(base + rng.integers(-6, 7, base.shape), 0, 255).astype(np.uint8)
    moved = base.copy()
    moved[100:140, 60:100] = 250  # a 40 px bright cube appears
    assert change(thumbnail(base), thumbnail(noisy)) < 0.002
    # 1600 of 50176 pixels change by 130/255: 0.0163 of the mean, kept exactly by block means
    expected = 1600 / 224**2 * 130 / 255
    assert change(thumbnail(base), thumbnail(moved)) == pytest.approx(expected, rel=0.02)


def test_scene_change_tracks_reference_per_camera():
    tracker = SceneChange(size=2)
    black, white = np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)
    tracker.update("scene", black)
    assert tracker.change("scene") is None  # no reference yet
    tracker.mark_encoded("scene")
    tracker.mark_encoded("wrist")  # no frame yet: nothing to mark
    assert tracker.change("scene") == 0.0 and tracker.change("wrist") is None
    tracker.update("scene", white)
    tracker.update("wrist", white)
    assert tracker.change("scene") == pytest.approx(1.0)
    assert tracker.cameras == ["scene", "wrist"]
    tracker.mark_encoded("scene")
    assert tracker.change("scene") == 0.0
    tracker.reset()
    assert tracker.change("scene") is None
    tracker.update("scene", np.zeros((8, 4, 3), np.uint8))  # aspect changed: 4x2 thumbnail
    tracker.mark_encoded("scene")
    tracker.update("scene", np.zeros((4, 4, 3), np.uint8))
    assert tracker.change("scene") is None
