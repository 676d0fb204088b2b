"""Per-feature statistics of meta/stats.json and the episode rows, as lerobot computes them:
min/max/mean/std/count and the quantiles q01..q99 (from a histogram, as lerobot estimates them).
"""

from __future__ import annotations

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_NAMES = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
HISTOGRAM_BINS = 5000
# lerobot's image stats: up to ~100 evenly spread frames of a short episode, and images with a
# side of 300 px or more subsampled to about 150 px.
MIN_IMAGE_SAMPLES = 100
MAX_IMAGE_SAMPLES = 10_000
DOWNSAMPLE_FROM = 300
DOWNSAMPLE_TO = 150


def _histogram_quantile(column: np.ndarray, low: float, high: float, target: float) -> float:
    edges = np.linspace(low - 1e-10, high + 1e-10, HISTOGRAM_BINS + 1)
    cumulative = np.cumsum(np.histogram(column, bins=edges)[0])
    index = int(np.searchsorted(cumulative, target))
    if index == 0:
        return float(edges[0])
    if index >= len(cumulative):
        return float(edges[-1])
    before = cumulative[index - 1]
    inside = cumulative[index] - before
    if inside == 0:
        return float(edges[index])
    return float(edges[index] + (target - before) / inside * (edges[index + 1] - edges[index]))


def _vector_stats(samples: np.ndarray) -> dict[str, np.ndarray]:
    """(N, D) samples -> per-column stats, each of shape (D,)."""
    samples = samples.astype(np.float64)
    result = {
        "min": samples.min(0),
        "max": samples.max(0),
        "mean": samples.mean(0),
        "std": samples.std(0),
    }
    for name, q in zip(QUANTILE_NAMES, QUANTILES, strict=True):
        if len(samples) < 2:  # lerobot's convention for a single sample
            result[name] = result["mean"].copy()
            continue
        result[name] = np.array([
            _histogram_quantile(samples[:, d], result["min"][d], result["max"][d], q * len(samples))
            for d in range(samples.shape[1])
        ])  # fmt: skip
    return result


def feature_stats(x: np.ndarray) -> dict:
    """Stats over the frames (axis 0) of one episode's vector or scalar feature."""
    x = np.asarray(x)
    stats = _vector_stats(x.reshape(len(x), -1))
    result = {k: v.tolist() for k, v in stats.items()}
    result["count"] = [int(len(x))]
    return result


def _image_sample_indices(n: int) -> np.ndarray:
    wanted = max(min(MIN_IMAGE_SAMPLES, n), min(int(n**0.75), MAX_IMAGE_SAMPLES))
    return np.round(np.linspace(0, n - 1, wanted)).astype(int)


def image_stats(frames: np.ndarray) -> dict:
    """Per-channel stats in [0, 1] with lerobot's (3, 1, 1) shape, over the frames lerobot
    samples; count is the number of sampled frames."""
    sampled = frames[_image_sample_indices(len(frames))]
    height, width = sampled.shape[1:3]
    if max(height, width) >= DOWNSAMPLE_FROM:
        step = int(max(height, width) / DOWNSAMPLE_TO)
        sampled = sampled[:, ::step, ::step]
    stats = _vector_stats(sampled.reshape(-1, sampled.shape[-1]))
    result = {k: (v / 255.0).reshape(-1, 1, 1).tolist() for k, v in stats.items()}
    result["count"] = [int(len(sampled))]
    return result


def merge_stats(parts: list[dict]) -> dict:
    """Pooled stats of per-episode stats: min/max/mean/std exact (from counts, means,
    variances), quantiles count-weighted as lerobot aggregates them (where every part has
    them)."""
    counts = np.array([p["count"][0] for p in parts], dtype=np.float64)
    means = np.array([p["mean"] for p in parts], dtype=np.float64)
    variances = np.array([p["std"] for p in parts], dtype=np.float64) ** 2
    total = counts.sum()
    weights = (counts / total).reshape(-1, *([1] * (means.ndim - 1)))
    mean = (weights * means).sum(0)
    var = (weights * (variances + (means - mean) ** 2)).sum(0)
    result = {
        "min": np.min([p["min"] for p in parts], axis=0).tolist(),
        "max": np.max([p["max"] for p in parts], axis=0).tolist(),
        "mean": mean.tolist(),
        "std": np.sqrt(var).tolist(),
        "count": [int(total)],
    }
    for name in QUANTILE_NAMES:
        if all(name in p for p in parts):
            values = np.array([p[name] for p in parts], dtype=np.float64)
            result[name] = (weights * values).sum(0).tolist()
    return result
