"""ThrottledLog: at most one line per period, for all messages or for each distinct one."""

from __future__ import annotations

import pytest
import rclpy.logging

from vla_runtime.ros import runtime
from vla_runtime.ros.runtime import ThrottledLog


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: now[0])
    return now


def test_one_line_per_period_whatever_the_message(clock):
    lines = []
    log = ThrottledLog(lines.append, period_s=2.0)
    assert log("a") and not log("b")
    clock[0] += 1.9
    assert not log("a")
    clock[0] += 0.1
    assert log("b")
    assert lines == ["a", "b"]


def test_per_message_logs_a_new_message_at_once_and_repeats_per_period(clock):
    lines = []
    log = ThrottledLog(lines.append, period_s=2.0, per_message=True)
    assert log("a") and log("b") and not log("a")
    clock[0] += 2.0
    assert log("a") and log("b")
    assert lines == ["a", "b", "a", "b"]


def test_two_on_one_node_logger_at_two_severities_both_log():
    """rclpy fixes a call site's severity per logger object, and both log from one line."""
    logger = rclpy.logging.get_logger("throttled_log_test")
    error = ThrottledLog(logger.error, per_message=True)
    info = ThrottledLog(logger.info, per_message=True)
    assert error("failed") and info("waiting") and error("failed again") and info("still")
