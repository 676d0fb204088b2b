"""A camera's frames to and from an mp4 file (OpenCV, codec `schema.FOURCC`)."""

from __future__ import annotations

from pathlib import Path

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


def read_video(path: Path) -> np.ndarray:
    """All frames of a video as (T, H, W, 3) uint8 RGB."""

    capture = cv2.VideoCapture(str(path))
    frames = []
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(frame[:, :, ::-1])
    finally:
        capture.release()
    if not frames:
        raise DatasetError(f"{path}: no decodable frames")
    return np.stack(frames)
