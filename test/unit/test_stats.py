import pytest

from vla_runtime.core.stats import RateMeter, Reservoir, summarize, wilson_interval


def test_summarize_exact_figures():
    result = summarize([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert result["n"] == 10
    assert result["p50"] == pytest.approx(5.5)
    # rank 0.99 * 9 = 8.91 -> 9 + 0.91 * (10 - 9)
    assert result["p99"] == pytest.approx(9.91)
    assert result["max"] == 10.0
    assert result["mean"] == pytest.approx(5.5)


def test_summarize_unsorted_input_and_single_sample():
    assert summarize([30.0, 10.0, 20.0])["p50"] == pytest.approx(20.0)
    single = summarize([4.0])
    assert single == {"n": 1, "p50": 4.0, "p99": 4.0, "max": 4.0, "mean": 4.0}


def test_summarize_empty_and_bad_input():
    assert summarize([]) == {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    with pytest.raises(ValueError, match="finite"):
        summarize([1.0, float("nan")])


def test_rate_meter():
    meter = RateMeter()
    assert meter.rate_hz == 0.0
    meter.add(10.0)
    assert meter.rate_hz == 0.0  # one receipt spans no interval
    for k in range(1, 21):
        meter.add(10.0 + 0.05 * k)
    assert meter.count == 21
    assert meter.t_first == 10.0
    assert meter.t_last == pytest.approx(11.0)
    assert meter.rate_hz == pytest.approx(20.0)


def test_rate_meter_zero_span_is_zero_rate():
    meter = RateMeter()
    meter.add(3.0)
    meter.add(3.0)
    assert meter.rate_hz == 0.0


def test_windowed_rate_meter_follows_the_newest_receipts():
    meter = RateMeter(window=5)
    for k in range(10):
        meter.add(0.1 * k)  # 10 Hz
    assert meter.rate_hz == pytest.approx(10.0)
    for k in range(1, 5):
        meter.add(0.9 + 0.5 * k)  # then 2 Hz: the window spans 0.9 .. 2.9 s
    assert meter.t_first == pytest.approx(0.9) and meter.t_last == pytest.approx(2.9)
    assert meter.rate_hz == pytest.approx(4 / 2.0)
    assert meter.count == 14
    with pytest.raises(ValueError, match="window"):
        RateMeter(window=1)


def test_reservoir_below_capacity_keeps_everything():
    reservoir = Reservoir(capacity=5)
    for value in [5.0, 1.0, 3.0]:
        reservoir.add(value)
    assert reservoir.samples == [5.0, 1.0, 3.0]
    assert reservoir.summary() == summarize([5.0, 1.0, 3.0])


def test_reservoir_is_bounded_with_exact_totals():
    reservoir = Reservoir(capacity=100, seed=1)
    for value in range(1000):
        reservoir.add(float(value))
    assert len(reservoir.samples) == 100
    assert reservoir.seen == 1000
    summary = reservoir.summary()
    assert summary["n"] == 1000
    assert summary["max"] == 999.0
    assert summary["mean"] == pytest.approx(499.5)
    # A uniform sample of 0..999 has its median near 500; a reservoir that only kept the
    # first (or last) 100 values would have it at 49.5 (or 949.5).
    assert 300.0 < summary["p50"] < 700.0
    assert len(set(reservoir.samples)) == 100


def test_reservoir_is_reproducible_and_rejects_bad_input():
    a, b = Reservoir(capacity=10, seed=3), Reservoir(capacity=10, seed=3)
    for value in range(200):
        a.add(value)
        b.add(value)
    assert a.samples == b.samples
    with pytest.raises(ValueError):
        a.add(float("inf"))
    with pytest.raises(ValueError):
        Reservoir(capacity=0)


def test_wilson_interval_matches_textbook_values():
    # Newcombe (1998), Table I: 81/263 -> 0.2553-0.3662; 15/148 -> 0.0624-0.1605; 0/10 -> 0-0.2775
    for (k, n), (low, high) in {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605),
                                (0, 10): (0.0, 0.2775)}.items():  # fmt: skip
        assert wilson_interval(k, n) == pytest.approx((low, high), abs=5e-5)
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and low == pytest.approx(0.7225, abs=5e-5)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
