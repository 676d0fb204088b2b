"""servoJ parameters and UR safety-status handling (pure logic of the ur_rtde driver)."""

from __future__ import annotations

import pytest

from vla_runtime.core.ur_servo import ServoParams, StopMonitor, safety_flags, stop_reason


def test_default_servo_parameters_are_ur_rtde_defaults_at_500_hz():
    params = ServoParams().validated()
    assert params.period_s == 0.002
    assert params.servo_args([0, 1, 2, 3, 4, 5]) == (
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 0.5, 0.5, 0.002, 0.1, 300.0
    )  # fmt: skip
    assert ServoParams(rate_hz=125.0).validated().period_s == 0.008  # CB3


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        (ServoParams(lookahead_s=0.02), "lookahead_s 0.02 outside [0.03, 0.2]"),
        (ServoParams(lookahead_s=0.25), "lookahead_s 0.25 outside [0.03, 0.2]"),
        (ServoParams(gain=99.0), "gain 99.0 outside [100, 2000]"),
        (ServoParams(gain=float("nan")), "gain nan outside [100, 2000]"),
        (ServoParams(rate_hz=1000.0), "rate_hz 1000.0 is not a UR control rate [125.0, 500.0]"),
    ],
)
def test_out_of_range_servo_parameters_are_refused_with_the_reason(params, problem):
    assert params.problems() == [problem]
    with pytest.raises(ValueError, match="servoJ parameters"):
        params.validated()
    assert ServoParams(lookahead_s=0.03, gain=2000.0).problems() == []  # bounds are inclusive


def test_safety_bits_name_the_stop():
    assert safety_flags(0b1) == ["normal_mode"]
    assert safety_flags(0b101) == ["normal_mode", "protective_stopped"]
    assert stop_reason(0b1) is None
    assert stop_reason(0b11) is None  # reduced mode still moves
    assert stop_reason(1 << 2) == "protective_stopped"
    assert stop_reason(1 << 7) == "emergency_stopped"
    assert stop_reason((1 << 4) | (1 << 2)) == "protective_stopped"  # the first stop bit wins


def test_stop_monitor_reports_each_stop_once_and_its_clearing():
    monitor = StopMonitor()
    assert monitor.update(0b1) is None
    assert monitor.update(0b101) == ("stopped", "protective_stopped")
    assert monitor.update(0b101) is None  # still stopped: no repeat
    assert monitor.stopped == "protective_stopped"
    assert monitor.update(0b1) == ("cleared", "protective_stopped")
    assert monitor.update(0b1) is None
    assert monitor.update(1 << 6) == ("stopped", "robot_emergency_stopped")
    assert monitor.update(1 << 2) == ("stopped", "protective_stopped")  # one stop became another
