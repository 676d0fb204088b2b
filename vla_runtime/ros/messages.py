"""Conversions between ROS messages and the core's types: stamps, images, camera calibrations,
joint states, commands, diagnostics, action chunks and safety events.

Chunks (and inference requests, the plan still to run) are `trajectory_msgs/JointTrajectory`
messages with the convention of docs/design.md §2; `chunk_from_msg` and `chunk_msg` are the only
places that read or build them. A request's `header.frame_id` is "req:<id>" ("req:<id> retry:<n>"
after n refused answers in a row) and the chunk answering it echoes "req:<id>"; the safety
node's chunk verdict events carry that as "request".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
from builtin_interfaces.msg import Duration
from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import TransformStamped
from sensor_msgs.msg import CameraInfo, Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_runtime.core.calibration_files import StaticTransform
from vla_runtime.core.camera_calibration import CameraCalibration
from vla_runtime.core.gripper import width_from_opening
from vla_runtime.core.safety.chunk_check import STALE, VETO, Chunk, Verdict
from vla_runtime.core.streaming.streamer import Request, Setpoint

# A chunk's serialized size at most: ~10 000 points of an 8-joint arm, ten times what the
# chunk checker accepts, so a legitimate chunk is never refused by its size.
MAX_CHUNK_BYTES = 1 << 20
REQUEST_PREFIX = "req:"
RETRY_PREFIX = " retry:"


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


def image_msg(frame: np.ndarray, stamp: TimeMsg, frame_id: str) -> Image:
    """An rgb8 Image of an HxWx3 RGB frame (what `image_from_msg` reads back)."""
    height, width = frame.shape[:2]
    msg = Image(height=height, width=width, encoding="rgb8", is_bigendian=0, step=width * 3)
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.data = np.ascontiguousarray(frame, dtype=np.uint8).tobytes()
    return msg


def camera_info_msg(calibration: CameraCalibration, frame_id: str) -> CameraInfo:
    """The CameraInfo of an image of the calibration's size (unstamped: set it per frame)."""
    info = CameraInfo(
        width=calibration.width,
        height=calibration.height,
        distortion_model=calibration.distortion_model,
        d=[float(v) for v in calibration.D],
        k=[float(v) for v in calibration.K.ravel()],
        r=[float(v) for v in calibration.R.ravel()],
        p=[float(v) for v in calibration.P.ravel()],
    )
    info.header.frame_id = frame_id
    return info


def transform_stamped_msg(transform: StaticTransform, stamp: TimeMsg) -> TransformStamped:
    msg = TransformStamped()
    msg.header.stamp = stamp
    msg.header.frame_id, msg.child_frame_id = transform.parent, transform.child
    t, q = msg.transform.translation, msg.transform.rotation
    t.x, t.y, t.z = (float(v) for v in transform.translation)
    q.x, q.y, q.z, q.w = (float(v) for v in transform.rotation)
    return msg


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


def arm_command_msg(interface: str, joints: Sequence[str], arm, lookahead_s: float):
    """The arm controller's command for the positions `arm` on `interface`: "forward_position",
    a Float64MultiArray; "trajectory", a one-point JointTrajectory stamped 0 ("start now") that
    reaches `arm` `lookahead_s` later, the way MoveIt Servo streams to a trajectory controller."""
    if interface == "forward_position":
        return Float64MultiArray(data=arm.tolist())
    return chunk_msg(joints, 0.0, [lookahead_s], [arm])


def diagnostics_msg(
    name: str, level, message: str, values: Mapping, stamp: TimeMsg, hardware_id: str = ""
) -> DiagnosticArray:
    """A DiagnosticArray of one status whose key-values are `values` (as strings, in order)."""
    status = DiagnosticStatus(
        level=level,
        name=name,
        message=message,
        hardware_id=hardware_id,
        values=[KeyValue(key=k, value=str(v)) for k, v in values.items()],
    )
    array = DiagnosticArray(status=[status])
    array.header.stamp = stamp
    return array


def joint_state_values(msg: JointState, joints: Sequence[str]):
    """(positions, velocities) of `joints`, in that order; velocities None unless the message has
    one per name. None when a joint or its position is missing."""
    index = {name: i for i, name in enumerate(msg.name)}
    try:
        columns = [index[j] for j in joints]
        positions = [msg.position[c] for c in columns]
    except (KeyError, IndexError):
        return None
    if len(msg.velocity) != len(msg.name):
        return positions, None
    return positions, [msg.velocity[c] for c in columns]


def joint_state_msg(names: Sequence[str], stamp: TimeMsg, positions, velocities) -> JointState:
    """A JointState of `names` (a driver's /joint_states)."""
    msg = JointState(name=list(names))
    msg.header.stamp = stamp
    msg.position = [float(v) for v in positions]
    msg.velocity = [float(v) for v in velocities]
    return msg


def command_msg(joint_names: Sequence[str], setpoint: Setpoint) -> JointState:
    """The streamer's command: the setpoint, stamped with the command time it is for."""
    msg = JointState(name=list(joint_names))
    msg.header.stamp = to_time(setpoint.time)
    msg.position = setpoint.position.tolist()
    msg.velocity = setpoint.velocity.tolist()
    return msg


def command_values(msg: JointState, arm_joints: Sequence[str], gripper_joint: str | None):
    """(arm positions in `arm_joints` order, gripper width or None) of a streamer command (the
    gripper column is one finger's opening). None when a named joint lacks a position or an arm
    joint is missing."""
    with_gripper = gripper_joint is not None and gripper_joint in msg.name
    values = joint_state_values(msg, [*arm_joints, *([gripper_joint] if with_gripper else [])])
    if values is None:
        return None
    positions, n = values[0], len(arm_joints)
    return positions[:n], (width_from_opening(positions[n]) if with_gripper else None)


def request_msg(joint_names: Sequence[str], request: Request) -> JointTrajectory:
    frame_id = f"{REQUEST_PREFIX}{request.request_id}"
    if request.retry:
        frame_id += f"{RETRY_PREFIX}{request.retry}"
    return chunk_msg(joint_names, request.stamp, request.times_from_start, request.positions,
                     frame_id)  # fmt: skip


def split_request_frame(frame_id: str) -> tuple[str, int]:
    """(the id part a chunk echoes, the retry count) of a request's frame id; a retry count
    that is not a non-negative integer counts as 0."""
    head, _, retry = frame_id.partition(RETRY_PREFIX)
    return head, int(retry) if retry.isdigit() else 0


def parse_request_id(frame_id: str) -> int | None:
    """The request id a "req:<id>" frame id names (with or without a retry count), else None."""
    head, _ = split_request_frame(frame_id)
    if head.startswith(REQUEST_PREFIX):
        try:
            return int(head[len(REQUEST_PREFIX) :])
        except ValueError:
            return None
    return None


def checked_chunk_msg(msg: JointTrajectory, verdict: Verdict) -> JointTrajectory:
    """The chunk `msg` as the (accept or clip) `verdict` lets it run; its stamp moves only when
    the check re-timed it."""
    stamp = msg.header.stamp
    if verdict.stamp is not None and verdict.stamp != to_seconds(stamp):
        stamp = verdict.stamp
    return chunk_msg(msg.joint_names, stamp, verdict.times, verdict.positions,
                     msg.header.frame_id)  # fmt: skip


def event_json(event: dict, source: str) -> str:
    """An event as the JSON text of an events topic, its `source` first."""
    return json.dumps({"source": source, **event}, default=_json_number)


def _json_number(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")


def json_object(text: str) -> dict | None:
    """One JSON object from an events topic's text, None for anything else."""
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def refused_request(event: str) -> int | None:
    """The request id a safety chunk verdict refuses (veto, stale), from its JSON event."""
    event = json_object(event)
    if event is None or event.get("event") != "chunk":
        return None
    if event.get("verdict") not in (VETO, STALE):
        return None
    return parse_request_id(str(event.get("request", "")))


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
