"""A camera's frames to and from an mp4 file.

Writing uses OpenCV (codec `schema.FOURCC`), the fast path of our own datasets. Reading uses
PyAV, whose wheel bundles FFmpeg with the dav1d AV1 decoder: lerobot writes AV1 by default,
which OpenCV's FFmpeg cannot decode. `encode_video` (PyAV, any codec the wheel ships, AV1
included) writes videos the way lerobot does, for tests and fixtures.
"""

from __future__ import annotations

from pathlib import Path

import av
import cv2
import numpy as np

from vla_runtime.data.lerobot.schema import FOURCC, DatasetError


def write_video(path: Path, frames: np.ndarray, fps: float) -> None:
    """Encode (T, H, W, 3) uint8 RGB frames."""

    height, width = frames.shape[1:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*FOURCC), fps, (width, height))
    if not writer.isOpened():
        raise DatasetError(f"OpenCV cannot encode {FOURCC} video to {path}")
    try:
        for frame in frames:
            writer.write(np.ascontiguousarray(frame[:, :, ::-1]))  # RGB -> BGR
    finally:
        writer.release()


def encode_video(
    path: Path, frames: np.ndarray, fps: int, codec: str = "libsvtav1", options: dict | None = None
) -> None:
    """Encode (T, H, W, 3) uint8 RGB frames with PyAV: frame t at t / fps seconds."""

    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps, options=options or {})
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())


def read_video(path: Path) -> np.ndarray:
    """All frames of a video as (T, H, W, 3) uint8 RGB."""

    frames = [frame for _, frame in _decode(path, 0.0, None)]
    if not frames:
        raise DatasetError(f"{path}: no decodable frames")
    return np.stack(frames)


def read_video_frames(path: Path, timestamps: np.ndarray, tolerance_s: float) -> np.ndarray:
    """The frames shown at `timestamps` (s from the file's start) as (T, H, W, 3) uint8 RGB: for
    each, the decoded frame nearest in time, which must lie within `tolerance_s` of it. Used for
    files that hold several episodes, each a time range of the file."""

    timestamps = np.asarray(timestamps, np.float64)
    decoded = list(_decode(path, float(timestamps.min()), float(timestamps.max())))
    if not decoded:
        raise DatasetError(f"{path}: no decodable frames near {timestamps.min():.3f} s")
    times = np.array([t for t, _ in decoded])
    nearest = np.abs(times[None, :] - timestamps[:, None]).argmin(1)
    off = np.abs(times[nearest] - timestamps)
    if off.max() > tolerance_s:
        worst = int(off.argmax())
        raise DatasetError(
            f"{path}: no frame within {tolerance_s:.4f} s of {timestamps[worst]:.4f} s "
            f"(nearest at {times[nearest[worst]]:.4f} s)"
        )
    return np.stack([decoded[i][1] for i in nearest])


def _decode(path: Path, first: float, last: float | None):
    """(time in s, RGB frame) of the frames from the keyframe before `first` up to the first
    frame at or after `last` (None: to the end)."""

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            if first > 0:
                # Seeking lands on the keyframe at or before `first`; decoding goes on from there.
                container.seek(int(first / stream.time_base), stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                time = float(frame.pts * stream.time_base)
                yield time, frame.to_ndarray(format="rgb24")
                if last is not None and time >= last:
                    break
    except av.FFmpegError as exc:
        raise DatasetError(f"{path}: cannot decode ({exc})") from exc
