"""Conversions between ROS messages and the core's types: stamps and images."""

from __future__ import annotations

import numpy as np
from builtin_interfaces.msg import Duration
from builtin_interfaces.msg import Time as TimeMsg
from sensor_msgs.msg import Image


def to_seconds(stamp: TimeMsg | Duration) -> float:
    """A builtin_interfaces Time or Duration in seconds."""
    return stamp.sec + stamp.nanosec * 1e-9


def image_from_msg(msg: Image) -> np.ndarray:
    """HxWx3 uint8 RGB view of an rgb8/bgr8 Image (rows may be padded: `step`)."""
    if msg.encoding not in ("rgb8", "bgr8"):
        raise ValueError(f"unsupported image encoding '{msg.encoding}' (need rgb8 or bgr8)")
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if step < w * 3 or len(msg.data) < h * step:
        raise ValueError(f"image data too short: {len(msg.data)} bytes for {h}x{w} step {step}")
    rows = np.frombuffer(msg.data, dtype=np.uint8, count=h * step).reshape(h, step)
    image = rows[:, : w * 3].reshape(h, w, 3)
    return image[:, :, ::-1] if msg.encoding == "bgr8" else image
