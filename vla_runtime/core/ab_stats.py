"""Statistics for A/B tests of two ways to run one policy (no ROS imports).

Episodes come in pairs (the same scene seed for both arms), so success is compared both as two
proportions (Newcombe's hybrid score interval, built from Wilson intervals) and on the pairs
(exact McNemar test on the discordant pairs). Continuous figures (time to success, latency)
get a percentile-bootstrap interval for the difference of medians and a Mann-Whitney U test.
`PairedSprt` stops a run early once the discordant pairs make the answer clear, with its error
rates fixed in advance (Wald's sequential probability ratio test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu

from vla_runtime.core.stats import wilson_interval


def newcombe_difference(
    k_a: int, n_a: int, k_b: int, n_b: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(p_a - p_b, low, high): Newcombe's method 10 (1998), which keeps good coverage at small
    n and near 0 or 1, where the Wald interval does not."""
    p_a, p_b = k_a / n_a, k_b / n_b
    low_a, high_a = wilson_interval(k_a, n_a, confidence)
    low_b, high_b = wilson_interval(k_b, n_b, confidence)
    difference = p_a - p_b
    low = difference - math.hypot(p_a - low_a, high_b - p_b)
    high = difference + math.hypot(high_a - p_a, p_b - low_b)
    return difference, low, high


def mcnemar_exact_p(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: pairs where only A succeeded vs only B, which are
    Binomial(a_only + b_only, 1/2) when the arms are equally good."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(a_only, b_only) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def bootstrap_median_difference(
    a, b, confidence: float = 0.95, resamples: int = 4000, seed: int = 0
) -> tuple[float, float, float] | None:
    """(median(a) - median(b), low, high), percentile bootstrap; None when a side is empty."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        return None
    rng = np.random.default_rng(seed)
    med_a = np.median(rng.choice(a, (resamples, a.size)), axis=1)
    med_b = np.median(rng.choice(b, (resamples, b.size)), axis=1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(med_a - med_b, [tail, 100 - tail])
    return float(np.median(a) - np.median(b)), float(low), float(high)


def mann_whitney_p(a, b) -> float | None:
    """Two-sided Mann-Whitney U p-value (None when a side is empty)."""
    if len(a) == 0 or len(b) == 0:
        return None
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


@dataclass
class PairedSprt:
    """Wald's SPRT on the discordant pairs (one arm succeeded, the other did not).

    Under "no difference" each discordant pair favours A with probability 1/2; the test looks
    for a win probability of 1/2 + `effect` for either arm. Two one-sided tests share `alpha`
    (the chance to declare a difference that is not there); `beta` is the chance to miss an
    effect of that size. Pairs where both arms agree carry no information and are skipped."""

    effect: float = 0.3
    alpha: float = 0.05
    beta: float = 0.2
    a_only: int = 0
    b_only: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.effect < 0.5 or not 0 < self.alpha < 1 or not 0 < self.beta < 1:
            raise ValueError("PairedSprt: effect in (0, 0.5), alpha and beta in (0, 1)")

    def add(self, success_a: bool, success_b: bool) -> str | None:
        """Record one pair; returns the decision so far (see `decision`)."""
        if success_a and not success_b:
            self.a_only += 1
        elif success_b and not success_a:
            self.b_only += 1
        return self.decision

    def _llr(self, wins: int, losses: int) -> float:
        p = 0.5 + self.effect
        return wins * math.log(p / 0.5) + losses * math.log((1 - p) / 0.5)

    @property
    def decision(self) -> str | None:
        """ "a_better", "b_better", "no_difference", or None while the evidence is unclear."""
        upper = math.log((1 - self.beta) / (self.alpha / 2))
        lower = math.log(self.beta / (1 - self.alpha / 2))
        for_a, for_b = self._llr(self.a_only, self.b_only), self._llr(self.b_only, self.a_only)
        if for_a >= upper:
            return "a_better"
        if for_b >= upper:
            return "b_better"
        if for_a <= lower and for_b <= lower:
            return "no_difference"
        return None


def rms_jerk(t, q) -> float | None:
    """Root-mean-square jerk (rad/s^3, over joints and samples) of a sampled joint trajectory
    `q` (N, J) at times `t` (N,): how smooth the arm was asked to move."""
    t, q = np.asarray(t, dtype=float), np.asarray(q, dtype=float)
    keep = np.concatenate([[True], np.diff(t) > 1e-6])  # repeated stamps carry no new sample
    t, q = t[keep], q[keep]
    if t.size < 9:
        return None
    jerk = q
    for _ in range(3):
        jerk = np.gradient(jerk, t, axis=0)
    # One-sided differences at the ends spread one sample inwards per derivative.
    return float(np.sqrt(np.mean(jerk[3:-3] ** 2)))
