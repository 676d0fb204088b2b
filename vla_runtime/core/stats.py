"""Small measurement helpers for run reports and benchmarks (no ROS imports).

- `summarize(samples)`: n / p50 / p99 / max / mean of a list of numbers.
- `RateMeter`: message rate from receipt times, (n - 1) / (t_last - t_first), over all
  receipts or the newest few.
- `Reservoir`: a bounded, uniformly sampled set of latency samples whose n, max and mean
  stay exact over everything seen, so a long run keeps constant memory.
- `wilson_interval(successes, n)`: a confidence interval for a success rate that stays inside
  [0, 1] and is honest at 0/n and n/n, where the normal approximation is not.
- `compute_cost(engine_ms, modes, seconds)`: what a policy's inferences cost per control
  second, and the share of each compute mode that ran.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable
from statistics import NormalDist

import numpy as np


def summarize(samples: Iterable[float]) -> dict:
    """{"n", "p50", "p99", "max", "mean"}; percentiles interpolate linearly between ranks
    (numpy's default). With no samples every figure but n is None."""
    values = np.asarray(list(samples), dtype=float)
    if values.size == 0:
        return {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    if not np.all(np.isfinite(values)):
        raise ValueError("summarize: samples must be finite numbers")
    p50, p99 = np.percentile(values, [50.0, 99.0])
    return {
        "n": int(values.size),
        "p50": float(p50),
        "p99": float(p99),
        "max": float(values.max()),
        "mean": float(values.mean()),
    }


class RateMeter:
    """Counts receipts and derives the mean rate between the first and the last one; with
    `window`, between the first and the last of the newest `window` receipts (a rate that
    follows changes; `count` still counts them all)."""

    def __init__(self, window: int | None = None) -> None:
        if window is not None and window < 2:
            raise ValueError(f"RateMeter window must span >= 2 receipts, got {window}")
        self.count = 0
        self.t_first: float | None = None
        self.t_last: float | None = None
        self._recent: deque[float] | None = deque(maxlen=window) if window else None

    def add(self, t: float) -> None:
        """Record one receipt at time `t` (seconds, any clock as long as it is one clock)."""
        if self._recent is not None:
            self._recent.append(t)
            self.t_first = self._recent[0]
        elif self.t_first is None:
            self.t_first = t
        self.t_last = t
        self.count += 1

    @property
    def rate_hz(self) -> float:
        """(n - 1) / (t_last - t_first) over the n receipts measured; 0.0 until two of them
        span a positive interval."""
        n = self.count if self._recent is None else len(self._recent)
        if n < 2 or self.t_last is None or self.t_first is None:
            return 0.0
        span = self.t_last - self.t_first
        return (n - 1) / span if span > 0 else 0.0


class Reservoir:
    """Keeps at most `capacity` samples, each seen sample equally likely to be kept
    (Vitter's algorithm R); seeded so a run's report is reproducible."""

    def __init__(self, capacity: int = 10_000, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"Reservoir capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.samples: list[float] = []
        self.seen = 0
        self._sum = 0.0
        self._max = -math.inf
        self._rng = random.Random(seed)

    def add(self, value: float) -> None:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"Reservoir sample must be finite, got {value}")
        self.seen += 1
        self._sum += value
        self._max = max(self._max, value)
        if len(self.samples) < self.capacity:
            self.samples.append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.capacity:
            self.samples[slot] = value

    def summary(self) -> dict:
        """Percentiles from the kept samples; n, max and mean exact over all samples seen."""
        result = summarize(self.samples)
        if self.seen:
            result.update(n=self.seen, max=self._max, mean=self._sum / self.seen)
        return result


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for `successes` out of `n` Bernoulli trials."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, n > 0; got {successes}/{n}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def compute_cost(engine_ms: list[float], modes: list[str], seconds: float) -> dict:
    """Engine compute per control second (the engine's own ms summed over every chunk / the
    control seconds run), per chunk, and the share of each compute mode that ran. Empty when
    nothing ran."""
    if not engine_ms:
        return {}
    return {
        "engine_ms_per_control_s": sum(engine_ms) / seconds if seconds > 0 else None,
        "engine_ms_per_chunk": float(np.mean(engine_ms)),
        "modes": {m: modes.count(m) / len(modes) for m in sorted(set(modes))},
    }
