import pytest

from vla_runtime.core.stamped_window import StampedWindow


def test_the_window_keeps_its_span_oldest_first():
    window = StampedWindow(span_s=0.35)
    for k in range(10):
        window.add(1.0 + 0.1 * k, k)
    assert window.items() == (6, 7, 8, 9)
    assert [s for s, _ in window.stamped()] == pytest.approx([1.6, 1.7, 1.8, 1.9])


def test_a_repeated_stamp_replaces_the_newest_and_an_older_one_starts_afresh():
    window = StampedWindow(span_s=1.0)
    window.add(5.0, "a")
    window.add(5.1, "b")
    for _ in range(100):  # a paused clock
        window.add(5.1, "c")
    assert window.items() == ("a", "c")
    window.add(0.2, "d")  # a restarted simulator
    assert window.stamped() == ((0.2, "d"),)
