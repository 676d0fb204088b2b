"""Cheap image-space change per camera, a scheduler signal (pure numpy, no ROS).

A frame is reduced to a small grey thumbnail (block means: a few hundred µs for 224×224 rgb8);
change = mean absolute difference of two thumbnails in [0, 1]. Block averaging suppresses
render and sensor noise; what remains is objects and the view moving.
"""

from __future__ import annotations

import numpy as np

THUMBNAIL_SIZE = 32  # target pixels along the shorter side
# ITU-R BT.601 luma weights: the usual grey conversion
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def thumbnail(image: np.ndarray, size: int = THUMBNAIL_SIZE) -> np.ndarray:
    """Grey thumbnail in [0, 1] of an HxWx3 (or HxW) uint8 image by integer block means.

    The block edge is min(H, W) // size (at least 1); rows and columns that do not fill a whole
    block are cropped, so the result is (H // block, W // block)."""
    image = np.asarray(image)
    if image.ndim == 3:
        grey = image[..., :3].astype(np.float32) @ LUMA[: image.shape[2]]
    elif image.ndim == 2:
        grey = image.astype(np.float32)
    else:
        raise ValueError(f"expected an HxW or HxWx3 image, got shape {image.shape}")
    if size < 1:
        raise ValueError(f"thumbnail size must be >= 1, got {size}")
    block = max(1, min(grey.shape) // size)
    h, w = (grey.shape[0] // block) * block, (grey.shape[1] // block) * block
    if h == 0 or w == 0:
        raise ValueError(f"image {image.shape} is empty")
    blocks = grey[:h, :w].reshape(h // block, block, w // block, block)
    return blocks.mean(axis=(1, 3)) / 255.0


def change(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two thumbnails (0 = identical, 1 = black vs white)."""
    if a.shape != b.shape:
        raise ValueError(f"thumbnail shapes differ: {a.shape} vs {b.shape}")
    return float(np.abs(a - b).mean())


class SceneChange:
    """Per camera: the newest thumbnail and a reference (the frame the engine last encoded).

    `change(camera)` is how far the scene has moved from what the engine's cached vision KV of
    that camera saw; `mark_encoded(camera)` makes the newest frame the reference."""

    def __init__(self, size: int = THUMBNAIL_SIZE):
        self.size = size
        self._latest: dict[str, np.ndarray] = {}
        self._reference: dict[str, np.ndarray] = {}

    @property
    def cameras(self) -> list[str]:
        return sorted(self._latest)

    def update(self, camera: str, image: np.ndarray) -> None:
        self._latest[camera] = thumbnail(image, self.size)

    def mark_encoded(self, camera: str) -> None:
        if camera in self._latest:
            self._reference[camera] = self._latest[camera]

    def change(self, camera: str) -> float | None:
        """None until the camera has both a frame and a reference (or if the size changed)."""
        latest, reference = self._latest.get(camera), self._reference.get(camera)
        if latest is None or reference is None or latest.shape != reference.shape:
            return None
        return change(latest, reference)

    def reset(self) -> None:
        """Forget the references (new episode); the newest frames stay."""
        self._reference.clear()
