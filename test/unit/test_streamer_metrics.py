"""The streamer's reports (core/streaming/metrics.py) and its request bookkeeping
(core/streaming/requests.py)."""

import numpy as np
import pytest

from vla_runtime.core.interpolation import Limits
from vla_runtime.core.safety.chunk_check import Chunk
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.metrics import (
    ERROR,
    OK,
    WARN,
    LoopTiming,
    format_value,
    stats_status,
    streamer_metrics,
    streamer_stats,
)
from vla_runtime.core.streaming.requests import RequestTracker
from vla_runtime.core.streaming.streamer import ActionStreamer, chunk_in_joint_order

LIMITS = Limits(np.array([10.0]), np.array([100.0]), np.array([1e4]))
SETTINGS = dict(speed_scaling_topic="", speed_scaling_age_s=None, speed_scaling_rejected=0,
                mode="async", request_policy="threshold", control_rate_hz=250.0,
                tick_source="thread", overruns=2, episode=1)  # fmt: skip


def test_loop_timing_measures_period_error_and_tick_cost():
    timing = LoopTiming(0.004)
    for now_ns in (0, 4_000_000, 9_000_000, 12_500_000):  # periods 4, 5 and 3.5 ms
        timing.tick_started(now_ns)
    timing.tick_took(250e-6)
    error = timing.period_error_ms.summary()
    assert error["n"] == 3 and error["max"] == pytest.approx(1.0)
    assert error["p50"] == pytest.approx(0.5)
    assert timing.tick_us.summary()["p50"] == pytest.approx(250.0)


def test_stats_of_a_node_not_started_yet():
    values = streamer_stats(None, LoopTiming(0.004), **SETTINGS)
    assert values["started"] is False and values["overruns"] == 2 and "steps" not in values
    assert values["tick_us_p50"] is None and values["jitter_ms_max"] is None
    assert list(values)[:3] == ["speed_scaling_topic", "speed_scaling_age_s",
                                "speed_scaling_rejected"]  # fmt: skip
    assert stats_status(values) == (WARN, "waiting for the first joint state")
    waiting = {**values, "speed_scaling_topic": "/speed"}
    assert stats_status(waiting) == (
        WARN, "waiting for the first joint state and speed scaling (/speed)"
    )  # fmt: skip
    assert stats_status({**waiting, "speed_scaling_age_s": 0.5})[0] == WARN


def test_stats_status_of_a_running_streamer():
    streamer = ActionStreamer(StreamerConfig(control_period_s=0.25), LIMITS, [0.0])
    streamer.tick(1.0)
    values = streamer_stats(streamer_metrics(streamer), LoopTiming(0.25), **SETTINGS)
    assert values["started"] is True and values["steps"] == 1 and values["episode"] == 1
    assert stats_status(values) == (WARN, "holding (no plan)")
    assert stats_status({**values, "holding": False}) == (OK, "streaming")
    assert stats_status({**values, "speed_scaling": 0.0}) == (WARN, "paused (speed scaling 0)")
    assert stats_status({**values, "stale_executed": 1}) == (ERROR, "stale actions executed")


def test_report_values_as_text():
    assert format_value(None) == "" and format_value(1.0 / 3.0) == "0.333333"
    assert format_value(3) == "3" and format_value(True) == "True" and format_value("x") == "x"


def test_request_tracker_times_out_refuses_and_measures_the_delay():
    tracker = RequestTracker(warmup=0, timeout_s=1.0)
    first = tracker.send(now=0.0, step=10)
    assert tracker.pending == first and tracker.awaiting(1.0)
    assert not tracker.awaiting(1.5)  # given up
    assert (tracker.pending, tracker.timed_out) == (None, 1)
    second = tracker.send(now=2.0, step=20)
    assert tracker.answered(first, step=25) is None  # forgotten: no sample
    assert tracker.pending == second
    assert tracker.answered(None, step=32) == 12  # an answer without an id
    third = tracker.send(now=3.0, step=40)
    assert not tracker.refuse(third + 1) and tracker.refuse(third)
    assert (tracker.sent, tracker.refused, tracker.pending) == (3, 1, None)
    assert tracker.delay.expected_steps() == 12
    assert tracker.refused_in_a_row == 1
    tracker.refuse(tracker.send(now=4.0, step=50))
    assert tracker.refused_in_a_row == 2
    tracker.answered(tracker.send(now=5.0, step=60), step=66)
    assert tracker.refused_in_a_row == 0  # an answer came through


def test_chunk_columns_in_the_streamers_joint_order():
    def chunk(names, *rows):
        return Chunk(tuple(names), 0.0, tuple(0.1 * (k + 1) for k in range(len(rows))), rows)

    names = ["a", "b", "grip"]
    times, positions = chunk_in_joint_order(chunk(["b", "a"], (2.0, 1.0)), ["a", "b"], names, 0.04)
    np.testing.assert_array_equal(times, [0.1])
    np.testing.assert_array_equal(positions, [[1.0, 2.0, 0.04]])  # gripper held
    _, positions = chunk_in_joint_order(chunk(names, (1.0, 2.0, 0.03)), ["a", "b"], names, 0.04)
    np.testing.assert_array_equal(positions, [[1.0, 2.0, 0.03]])
    assert chunk_in_joint_order(chunk(["a", "a"], (1.0, 1.0)), ["a"], names, 0.0) == (
        "duplicated joint names ['a', 'a']"
    )  # fmt: skip
    assert chunk_in_joint_order(chunk(["a", "x"], (1.0, 1.0)), ["a", "b"], names, 0.0) == (
        "joint names ['a', 'x']: missing ['b'], unknown ['x']"
    )  # fmt: skip
    assert chunk_in_joint_order(chunk(["a", "b"], (1.0,)), ["a", "b"], names, 0.0) == (
        "point 0: 1 positions for 2 joints"
    )  # fmt: skip
