"""Extra inference delay injected on purpose (latency sweeps, fault tests).

Spec strings (engine parameter `inference_delay`, stack argument of the same name):
- "" or "0": none;
- "0.2": a fixed 200 ms;
- "lognormal:MEDIAN:SPIKE_P:SPIKE_MIN:SPIKE_MAX", e.g. "lognormal:0.08:0.05:0.4:0.8": a
  heavy-tailed delay, lognormal with median MEDIAN s (sigma 0.5) and, with probability SPIKE_P,
  a spike drawn uniformly from [SPIKE_MIN, SPIKE_MAX] s instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LOGNORMAL_SIGMA = 0.5


@dataclass(frozen=True)
class InjectedDelay:
    fixed_s: float = 0.0
    median_s: float = 0.0  # > 0: lognormal
    spike_p: float = 0.0
    spike_min_s: float = 0.0
    spike_max_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> InjectedDelay:
        text = str(text).strip()
        try:
            if text.startswith("lognormal:"):
                median, p, lo, hi = (float(x) for x in text.split(":")[1:])
                ok = median > 0 and 0 <= p <= 1 and 0 <= lo <= hi
                values = (median, p, lo, hi)
                if ok and all(math.isfinite(v) for v in values):
                    return cls(0.0, median, p, lo, hi)
            else:
                fixed = float(text or 0.0)
                if math.isfinite(fixed) and fixed >= 0:
                    return cls(fixed_s=fixed)
        except ValueError:
            pass
        raise ValueError(
            f"inference_delay {text!r}: expected seconds (e.g. 0.2) or "
            "lognormal:MEDIAN:SPIKE_P:SPIKE_MIN:SPIKE_MAX"
        )

    @property
    def active(self) -> bool:
        return self.fixed_s > 0 or self.median_s > 0

    def sample(self, rng: np.random.Generator) -> float:
        if self.median_s <= 0:
            return self.fixed_s
        if rng.random() < self.spike_p:
            return float(rng.uniform(self.spike_min_s, self.spike_max_s))
        return float(self.median_s * math.exp(LOGNORMAL_SIGMA * rng.standard_normal()))
