"""Delay estimator: executed control steps between request and answer, warm-up excluded."""

import pytest

from vla_runtime.core.delay import DelayEstimator


def record(estimator, delays, first_id=1):
    """Send request i at step 1000 * i and answer it `delay` steps later."""
    for i, delay in enumerate(delays, start=first_id):
        estimator.sent(i, 1000 * i)
        assert estimator.answered(i, 1000 * i + delay) == delay


def test_warmup_samples_are_excluded_from_statistics():
    estimator = DelayEstimator(warmup=2)
    record(estimator, [400, 90])  # e.g. first inference compiles, second fills caches
    assert estimator.summary()["n"] == 0
    assert estimator.expected_steps() == 90  # the latest warm-up sample until real ones exist
    record(estimator, [10, 12, 11, 13, 30], first_id=3)
    summary = estimator.summary()
    assert summary == {
        "n": 5,
        "p50": 12.0,
        "p95": pytest.approx(26.6),
        "max": 30.0,
        "warmup_seen": 2,
    }
    assert estimator.expected_steps() == 27  # p95 rounded up; 400 is never the estimate


def test_no_samples_means_zero_expected_delay():
    estimator = DelayEstimator(warmup=0)
    assert estimator.expected_steps() == 0
    assert estimator.summary()["p50"] is None
    record(estimator, [7])
    assert estimator.summary()["p50"] == 7.0 and estimator.expected_steps() == 7


def test_unknown_forgotten_and_superseded_requests():
    estimator = DelayEstimator(warmup=0)
    assert estimator.answered(99, 10) is None  # never sent
    estimator.sent(1, 0)
    estimator.forget(1)  # timed out
    assert estimator.answered(1, 50) is None
    estimator.sent(2, 100)
    estimator.sent(3, 105)
    assert estimator.answered(3, 120) == 15
    assert estimator.answered(2, 130) is None  # older than an answered one: dropped
    assert estimator.summary()["n"] == 1


def test_window_keeps_recent_samples_but_max_over_all():
    estimator = DelayEstimator(warmup=0, window=3)
    record(estimator, [50, 5, 6, 7])
    summary = estimator.summary()
    assert (summary["n"], summary["p50"], summary["max"]) == (3, 6.0, 50.0)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        DelayEstimator(warmup=-1)
    estimator = DelayEstimator()
    estimator.sent(1, 10)
    with pytest.raises(ValueError):
        estimator.answered(1, 5)
