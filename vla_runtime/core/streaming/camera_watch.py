"""Frozen cameras, seen from the frames alone: a camera that resends a frame (the same stamp), or
sends byte-identical frames while the arm moved enough between them to change any picture of it,
has stopped seeing the world, whatever its stamps say. Pure logic, no ROS.

A still arm in a still scene legitimately renders identical frames, so identical frames alone
prove nothing; and once frozen, a camera counts as live again only when a frame differs from the
frozen one (the arm may be at rest by then, so motion cannot be asked for)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_MOTION_RAD = 0.015  # joint travel between two frames that must show in the picture


@dataclass
class _Camera:
    stamp: float
    digest: int
    arm: np.ndarray | None
    frozen: int | None = None  # the digest of the frozen frame while frozen


class FrozenCameraWatch:
    def __init__(self, min_motion_rad: float = MIN_MOTION_RAD):
        self.min_motion_rad = min_motion_rad
        self._cameras: dict[str, _Camera] = {}

    @property
    def frozen(self) -> list[str]:
        return sorted(name for name, c in self._cameras.items() if c.frozen is not None)

    def frame(self, camera: str, stamp: float, digest: int, arm, now: float) -> dict | None:
        """A frame of `camera` stamped `stamp` with content `digest` arrived at `now` while the
        measured arm stood at `arm` (None: unknown). Returns an event when the camera froze
        or came back."""
        arm = None if arm is None else np.asarray(arm, dtype=float)
        last = self._cameras.get(camera)
        self._cameras[camera] = current = _Camera(stamp, digest, arm)
        if last is None:
            return None
        if last.frozen is not None:
            if digest != last.frozen and stamp > last.stamp:
                return {"event": "camera_live", "stamp": now, "camera": camera}
            current.frozen = last.frozen
            return None
        if stamp == last.stamp and digest == last.digest:
            reason = "frame resent with its stamp"
        elif digest == last.digest and arm is not None and last.arm is not None:
            moved = float(np.max(np.abs(arm - last.arm), initial=0.0))
            if moved < self.min_motion_rad:
                return None
            reason = f"identical frames while the arm moved {moved:.3f} rad"
        else:
            return None
        current.frozen = digest
        return {"event": "camera_frozen", "stamp": now, "camera": camera, "reason": reason}

    def reset(self) -> None:
        self._cameras.clear()
