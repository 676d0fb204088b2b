"""A/B statistics against textbook values and simulated streams with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.ab_stats import (
    PairedSprt,
    bootstrap_median_difference,
    mann_whitney_p,
    mcnemar_exact_p,
    newcombe_difference,
    rms_jerk,
)


@pytest.mark.parametrize(
    "counts, expected",
    [  # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10
        ((56, 70, 48, 80), (0.2, 0.0524, 0.3339)),
        ((9, 10, 3, 10), (0.6, 0.1705, 0.8090)),
        ((5, 56, 0, 29), (0.0893, -0.0381, 0.1926)),
        ((0, 10, 0, 20), (0.0, -0.1611, 0.2775)),
        ((0, 10, 0, 10), (0.0, -0.2775, 0.2775)),
        ((10, 10, 0, 20), (1.0, 0.6791, 1.0)),
    ],
)
def test_newcombe_interval_matches_the_published_table(counts, expected):
    assert newcombe_difference(*counts) == pytest.approx(expected, abs=1e-4)


def test_exact_mcnemar_is_the_two_sided_binomial_tail_of_the_discordant_pairs():
    assert mcnemar_exact_p(9, 2) == pytest.approx(2 * 67 / 2048)  # C(11,0..2) / 2^11, doubled
    assert mcnemar_exact_p(2, 9) == mcnemar_exact_p(9, 2)
    assert mcnemar_exact_p(0, 0) == 1.0 and mcnemar_exact_p(5, 5) == 1.0
    assert mcnemar_exact_p(10, 0) == pytest.approx(2 / 1024)


def test_bootstrap_and_mann_whitney_see_a_real_shift_and_not_a_null_one():
    rng = np.random.default_rng(3)
    slow, fast = rng.normal(50, 5, 60), rng.normal(40, 5, 60)
    estimate, low, high = bootstrap_median_difference(slow, fast)
    assert 5 < low < estimate < high < 15
    assert mann_whitney_p(slow, fast) < 1e-6
    _, low, high = bootstrap_median_difference(slow, rng.normal(50, 5, 60))
    assert low < 0 < high
    assert bootstrap_median_difference([], fast) is None and mann_whitney_p([], fast) is None


def _run_sprt(rng, p_a: float, p_b: float, max_pairs: int) -> str | None:
    test = PairedSprt(effect=0.3, alpha=0.05, beta=0.2)
    for _ in range(max_pairs):
        decision = test.add(rng.random() < p_a, rng.random() < p_b)
        if decision:
            return decision
    return None


def test_sprt_keeps_its_stated_error_rates_on_simulated_bernoulli_streams():
    rng = np.random.default_rng(0)
    runs = 2000
    # Equal arms: declaring either one better is a type I error (alpha 0.05).
    null = [_run_sprt(rng, 0.6, 0.6, 400) for _ in range(runs)]
    assert sum(d in ("a_better", "b_better") for d in null) / runs <= 0.05 + 0.01
    assert sum(d == "no_difference" for d in null) / runs > 0.8
    # A wins 80 % of the discordant pairs (0.8 * 0.5 against 0.2 * 0.5: effect 0.3); missing
    # it is a type II error (beta 0.2).
    strong = [_run_sprt(rng, 0.8, 0.5, 400) for _ in range(runs)]
    assert sum(d != "a_better" for d in strong) / runs <= 0.2 + 0.02
    assert sum(d == "b_better" for d in strong) / runs <= 0.01


def test_sprt_refuses_meaningless_settings():
    with pytest.raises(ValueError):
        PairedSprt(effect=0.6)


def test_rms_jerk_of_a_cubic_is_its_constant_third_derivative():
    t = np.linspace(0.0, 2.0, 201)
    q = np.stack([0.5 * t**3, -(t**3) / 6 + t], axis=1)  # jerk 3 and -1 rad/s^3
    assert rms_jerk(t, q) == pytest.approx(np.sqrt((9 + 1) / 2), rel=1e-3)
    assert rms_jerk(t[:3], q[:3]) is None
