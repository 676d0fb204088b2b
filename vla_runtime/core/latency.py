"""Latency figures from what a running stack publishes, and the stack parameters they set.

- camera latency: from the moment a frame's content existed (its stamp: a real camera's capture
  time, a sim camera's scene state) to its receipt by a subscriber;
- command -> motion: from sending a step command to the first joint state that moved, the
  delay the streamer's `driver_delay_s` puts its setpoints ahead by.
The safety node's chunk check refuses chunks whose observation is older than
`max_observation_age_s` at check time: camera latency is spent before the engine even sees
the frame, so the measured latency is added to the budget the default leaves for inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vla_runtime.core.safety.chunk_check import ChunkCheckConfig

# What the default freshness limit allows beyond a camera's own latency (inference + transport).
DEFAULT_CHUNK_AGE_ALLOWANCE_S = ChunkCheckConfig.max_observation_age_s


def summary(samples) -> dict:
    values = np.asarray(list(samples), dtype=float)
    if values.size == 0:
        raise ValueError("no samples")
    return {
        "median_s": float(np.median(values)),
        "p95_s": float(np.percentile(values, 95)),
        "min_s": float(values.min()),
        "p10_s": float(np.percentile(values, 10)),
        "samples": int(values.size),
    }


def match_receipts(
    content_receipts: dict[float, float], frames: list[tuple[float, float]], tolerance: float = 1e-4
) -> list[float]:
    """Latencies of `frames` [(stamp, receipt time)] against the receipt times of the states
    they show {state time: receipt time} (stamps match within `tolerance`)."""
    if not content_receipts:
        return []
    keys = np.array(sorted(content_receipts))
    out = []
    for stamp, received in frames:
        i = int(np.searchsorted(keys, stamp))
        for j in (i - 1, i):
            if 0 <= j < len(keys) and abs(keys[j] - stamp) <= tolerance:
                out.append(received - content_receipts[float(keys[j])])
                break
    return out


def motion_onset(times, values, before: np.ndarray, threshold: float) -> float | None:
    """Time of the first sample whose max abs departure from `before` exceeds threshold."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return None
    moved = np.max(np.abs(values.reshape(len(values), -1) - np.ravel(before)), axis=1) > threshold
    index = np.flatnonzero(moved)
    return float(np.asarray(times, float)[index[0]]) if index.size else None


def image_change(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute grey-level difference of two images."""
    return float(np.mean(np.abs(a.astype(np.int16) - b.astype(np.int16))))


@dataclass(frozen=True)
class LatencyMeasurement:
    cameras: dict[str, dict]  # camera -> summary() of capture -> receipt
    command_to_motion: dict  # summary() of command -> first moved joint state
    command_to_image_motion: dict[str, dict]  # camera -> summary() of command -> changed frame


def stack_parameters(measurement: LatencyMeasurement) -> dict[str, float]:
    """The stack arguments the measurement sets: the streamer's delay prior and the chunk
    check's freshness limit (the worst camera's 95th percentile on top of the default)."""
    worst_camera = max((c["p95_s"] for c in measurement.cameras.values()), default=0.0)
    return {
        "driver_delay_s": round(max(measurement.command_to_motion["median_s"], 0.0), 4),
        "max_observation_age_s": round(DEFAULT_CHUNK_AGE_ALLOWANCE_S + worst_camera, 4),
    }
