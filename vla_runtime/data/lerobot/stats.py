"""Per-feature statistics of meta/stats.json and the episode rows: min/max/mean/std/count."""

from __future__ import annotations

import numpy as np


def feature_stats(x: np.ndarray) -> dict:
    """Stats over the frames (axis 0) of one episode's vector feature."""
    x = np.asarray(x, dtype=np.float64)
    return {
        "min": x.min(0).tolist(),
        "max": x.max(0).tolist(),
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "count": [int(len(x))],
    }


def merge_stats(parts: list[dict]) -> dict:
    """Pooled min/max/mean/std of per-episode stats (exact: from counts, means, variances)."""
    counts = np.array([p["count"][0] for p in parts], dtype=np.float64)
    means = np.array([p["mean"] for p in parts], dtype=np.float64)
    variances = np.array([p["std"] for p in parts], dtype=np.float64) ** 2
    total = counts.sum()
    weights = (counts / total).reshape(-1, *([1] * (means.ndim - 1)))
    mean = (weights * means).sum(0)
    var = (weights * (variances + (means - mean) ** 2)).sum(0)
    return {
        "min": np.min([p["min"] for p in parts], axis=0).tolist(),
        "max": np.max([p["max"] for p in parts], axis=0).tolist(),
        "mean": mean.tolist(),
        "std": np.sqrt(var).tolist(),
        "count": [int(total)],
    }


def image_stats(frames: np.ndarray) -> dict:
    """Per-channel stats in [0, 1] with lerobot's (3, 1, 1) shape, from up to 32 frames."""
    step = max(1, len(frames) // 32)
    x = frames[::step].astype(np.float64) / 255.0
    pixels = x.reshape(-1, 3)
    shape = lambda v: np.asarray(v).reshape(3, 1, 1).tolist()  # noqa: E731
    return {
        "min": shape(pixels.min(0)),
        "max": shape(pixels.max(0)),
        "mean": shape(pixels.mean(0)),
        "std": shape(pixels.std(0)),
        "count": [int(len(frames))],
    }
