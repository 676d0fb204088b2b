"""Conversions between ROS messages and the core's types: stamps, images and action chunks.

Chunks (and inference requests, the plan still to run) are `trajectory_msgs/JointTrajectory`
messages with the convention of docs/design.md §2; `chunk_from_msg` and `chunk_msg` are the only
places that read or build them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from builtin_interfaces.msg import Duration
from builtin_interfaces.msg import Time as TimeMsg
from sensor_msgs.msg import Image
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_runtime.core.safety.chunk_check import Chunk


def to_seconds(stamp: TimeMsg | Duration) -> float:
    """A builtin_interfaces Time or Duration in seconds."""
    return stamp.sec + stamp.nanosec * 1e-9


def to_time(seconds: float) -> TimeMsg:
    sec, nanosec = divmod(round(seconds * 1e9), 10**9)
    return TimeMsg(sec=sec, nanosec=nanosec)


def to_duration(seconds: float) -> Duration:
    sec, nanosec = divmod(round(seconds * 1e9), 10**9)
    return Duration(sec=sec, nanosec=nanosec)


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


def chunk_from_msg(msg: JointTrajectory) -> Chunk:
    """The chunk a JointTrajectory carries, as sent (rows may be ragged: the checks judge)."""
    return Chunk(
        tuple(msg.joint_names),
        to_seconds(msg.header.stamp),
        tuple(to_seconds(p.time_from_start) for p in msg.points),
        tuple(tuple(p.positions) for p in msg.points),
    )


def chunk_msg(
    joint_names: Sequence[str],
    stamp: float | TimeMsg,
    times: Sequence[float],
    positions,
    frame_id: str = "",
) -> JointTrajectory:
    """A JointTrajectory: rows of `positions` at `times` from `stamp` (seconds or a Time
    message, kept exactly); stamp 0 means "start now" to a trajectory controller."""
    msg = JointTrajectory(joint_names=list(joint_names))
    msg.header.stamp = stamp if isinstance(stamp, TimeMsg) else to_time(stamp)
    msg.header.frame_id = frame_id
    for t, row in zip(times, positions, strict=True):
        msg.points.append(
            JointTrajectoryPoint(
                positions=[float(v) for v in row], time_from_start=to_duration(float(t))
            )
        )
    return msg


def trajectory_arguments(msg: JointTrajectory) -> dict:
    """A JointTrajectory command as the keyword arguments of a trajectory follower's
    `set_trajectory` (the simulator's, `ArmCommand`'s): every point's positions, velocities and
    accelerations, as sent."""
    points = msg.points
    return {
        "names": list(msg.joint_names),
        "positions": [list(p.positions) for p in points],
        "times": [to_seconds(p.time_from_start) for p in points],
        "velocities": [list(p.velocities) for p in points],
        "accelerations": [list(p.accelerations) for p in points],
        "start_time": to_seconds(msg.header.stamp),
    }
