"""Inference delay measured in control steps actually executed (docs/design.md §3).

A request leaves at control step s_req; the chunk answering it arrives when s_arr steps have
run; the delay sample is s_arr - s_req. Counting executed steps needs no clock shared with the
engine and stays right when the control loop or the sim clock stalls. The first
`warmup` samples (compilation, cache fills, first connections) are excluded from the statistics
so a slow start does not inflate the estimate for the whole run; until post-warm-up samples
exist, the expected delay is the most recent warm-up sample.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class DelayEstimator:
    def __init__(self, warmup: int = 3, window: int = 200):
        if warmup < 0 or window < 1:
            raise ValueError(f"warmup must be >= 0 and window >= 1, got {warmup}, {window}")
        self.warmup = warmup
        self.warmup_seen = 0
        self.samples: deque[int] = deque(maxlen=window)  # post-warm-up samples, newest last
        self.max_steps = 0  # over every post-warm-up sample, not only the window
        self._last_warmup: int | None = None
        self._sent: dict[int, int] = {}

    def sent(self, request_id: int, step: int) -> None:
        self._sent[request_id] = step

    def forget(self, request_id: int) -> None:
        """A request that will never be answered (timed out)."""
        self._sent.pop(request_id, None)

    def answered(self, request_id: int, step: int) -> int | None:
        """Record the arrival of the chunk for `request_id`; returns the delay in steps, or
        None for an unknown (already answered or forgotten) request."""
        sent_step = self._sent.pop(request_id, None)
        if sent_step is None:
            return None
        delay = step - sent_step
        if delay < 0:
            raise ValueError(f"request {request_id} answered at step {step} before sent")
        # Requests older than this one can no longer be answered in order; drop them.
        for old in [r for r in self._sent if r < request_id]:
            del self._sent[old]
        if self.warmup_seen < self.warmup:
            self.warmup_seen += 1
            self._last_warmup = delay
        else:
            self.samples.append(delay)
            self.max_steps = max(self.max_steps, delay)
        return delay

    def expected_steps(self, quantile: float = 95.0) -> int:
        """Delay to plan for: the `quantile` of the recent samples, rounded up; 0 before any."""
        if self.samples:
            return int(np.ceil(np.percentile(np.fromiter(self.samples, float), quantile)))
        return self._last_warmup or 0

    def summary(self) -> dict:
        """n / p50 / p95 / max in steps over post-warm-up samples (None before any)."""
        if not self.samples:
            return {"n": 0, "p50": None, "p95": None, "max": None, "warmup_seen": self.warmup_seen}
        values = np.fromiter(self.samples, float)
        p50, p95 = np.percentile(values, [50.0, 95.0])
        return {
            "n": len(values),
            "p50": float(p50),
            "p95": float(p95),
            "max": float(self.max_steps),
            "warmup_seen": self.warmup_seen,
        }
