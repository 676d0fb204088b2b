"""Earlier frames for a policy that sees motion: a camera of the policy may be another camera's
image `delay_s` before its newest (`CameraSpec.source`). One frame shows where a sliding cube
is, not where it is going; the pair shows both.

`FrameHistory` keeps the recent frames of the cameras that have such earlier views and picks,
for each, the kept frame captured nearest to `delay_s` before the newest; the episode's first
frame stands in until the history is that long (training clamps at the episode's start the
same way, `data/train.earlier_index`)."""

from __future__ import annotations

import numpy as np

from vla_runtime.core.stamped_window import StampedWindow
from vla_runtime.engine.policy import PolicySpec


class FrameHistory:
    def __init__(self, spec: PolicySpec):
        self.earlier = spec.earlier_frames
        longest = max((c.delay_s for c in self.earlier), default=0.0)
        self.span_s = 2.0 * longest  # a camera slower than the delay still has a frame before
        self._frames: dict[str, StampedWindow] = {
            c.source: StampedWindow(self.span_s) for c in self.earlier
        }

    def __bool__(self) -> bool:
        return bool(self.earlier)

    def add(self, camera: str, stamp: float, frame) -> None:
        """Record `camera`'s frame captured at `stamp` (any object: an image or a frame record);
        a stamp older than the newest kept (a new episode, a restarted clock) starts afresh."""
        kept = self._frames.get(camera)
        if kept is not None:
            kept.add(stamp, frame)

    def add_images(self, images: dict[str, np.ndarray], stamp: float) -> None:
        for camera, image in images.items():
            self.add(camera, stamp, image)

    def recorded(self, frame):
        """Record an environment frame's images (`sim.env.Frame`) and hand it on."""
        self.add_images(frame.images, frame.time)
        return frame

    def earlier_of(self, newest: dict[str, float], since: float = -np.inf) -> dict[str, object]:
        """Per earlier-frame camera, the kept frame of its source nearest to `delay_s` before
        that source's newest stamp (`newest`), among those captured at or after `since` (the
        episode's start) and not after the newest. A source with none kept is left out."""
        out = {}
        for camera in self.earlier:
            source_newest = newest.get(camera.source)
            if source_newest is None:
                continue
            candidates = [
                (stamp, frame)
                for stamp, frame in self._frames[camera.source].stamped()
                if since <= stamp <= source_newest
            ]
            if candidates:
                target = source_newest - camera.delay_s
                out[camera.name] = min(candidates, key=lambda c: abs(c[0] - target))[1]
        return out

    def complete(self, images: dict[str, np.ndarray], stamp: float) -> dict[str, np.ndarray]:
        """Record a synchronised set of images taken at `stamp` and return it with the earlier
        frames the policy also wants (the lock-step loops: every camera captured together)."""
        self.add_images(images, stamp)
        newest = {camera: stamp for camera in images}
        return {**images, **self.earlier_of(newest)}
