"""The direct Franka driver (franky-control) against franky-sim, a libfranka-protocol simulator
running as its own process: chunked trajectories and streamed setpoints run without a single
libfranka error, the tracking error is reported, and the gripper closes and opens. The probe
stands in for the safety gate (`command_source`); the driver obeys one arm interface at a time.

The 60 s version of this run is `vla-runtime bench driver --json`.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from vla_runtime.bench.driver import (
    WAVE,
    DriverProbe,
    run_chunks,
    start_franky_driver,
    start_franky_sim,
    stop_process,
    wave,
)
from vla_runtime.core.robot import load_robot

pytestmark = pytest.mark.integration


def obeying(interface: str) -> tuple[str, str]:
    """The driver parameters that make the probe its command source on `interface`."""
    return f"command_interface:={interface}", "command_source:=/driver_probe"


def test_franky_driver_streams_chunks_and_setpoints_without_libfranka_errors(rclpy_context):
    from std_msgs.msg import Float64MultiArray

    try:
        sim, robot_ip = start_franky_sim()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    fr3 = load_robot("fr3")
    home = np.array(fr3.home)
    driver = probe = None
    try:
        driver = start_franky_driver(robot_ip, "robot:=fr3", *obeying("trajectory"))
        probe = DriverProbe(rclpy_context, list(fr3.joints), fr3.controllers)
        assert probe.spin_until(lambda: probe.q is not None, 60), "no /joint_states"
        # Its report of the probe's forward publisher: the driver's check has seen the probe.
        assert probe.spin_until(lambda: probe.events, 30), "the driver's publisher check"

        # Home in 3 s (franky-sim starts elsewhere), then 1 s chunks sent every 0.5 s.
        probe.send_chunk([3.0], [home])
        assert probe.spin_until(lambda: np.abs(probe.q - home).max() < 0.05, 15), probe.events
        mark = len(probe.samples)
        errors = run_chunks(probe, home, seconds=6.0)
        swing = np.ptp(np.array([q for _, _, q in probe.samples[mark:]]), axis=0)
        assert np.all(swing > 0.5 * WAVE), (swing, probe.events)  # every joint followed the wave
        # How closely is a timing figure, `vla-runtime bench driver --json`'s: on a quiet host
        # p99 is ~0.04 rad, but this probe streams chunks and samples states over DDS, and a
        # slow host's full-suite run stretched it to 0.7-0.9 rad.
        print(f"chunk tracking error p99 {np.percentile(errors, 99):.4f} rad")

        probe.send_width(0.0)
        assert probe.spin_until(lambda: probe.fingers.sum() < 0.01, 20), probe.fingers
        probe.send_width(fr3.gripper_max_width)
        assert probe.spin_until(lambda: probe.fingers.sum() > 0.07, 20), probe.fingers
        stats = probe.fresh_stats()
        print("franky driver stats (trajectories):", json.dumps(stats))
        assert stats["libfranka_errors"] == 0, stats
        assert stats["gripper_calls"]["failed"] == 0 and stats["gripper_calls"]["grasp"] >= 1
        assert stats["tracking_error_rad"]["p99"] is not None
        # Nothing rejected, no error; only the probe's forward publisher, which is not obeyed.
        assert [e["event"] for e in probe.events] == ["unused_interface"], probe.events

        # Streamed setpoints: forward position commands at 50 Hz along the same wave, to a
        # driver obeying that interface.
        code, out = stop_process(driver)
        driver = None
        assert code == 0, out[-3000:]
        driver = start_franky_driver(robot_ip, "robot:=fr3", *obeying("forward_position"))
        probe.events.clear()
        assert probe.spin_until(
            lambda: probe.forward.get_subscription_count() > 0 and probe.events, 60
        ), "the driver obeying forward position commands"
        probe.spin_for(0.5)  # its first publisher check
        start = time.monotonic()
        while (t := time.monotonic() - start) < 3.0:
            target = wave(home, t)
            probe.forward.publish(Float64MultiArray(data=target.tolist()))
            probe.spin_for(0.02)
        probe.spin_for(1.0)
        assert np.abs(probe.q - target).max() < 0.05, (probe.q - target, probe.events)

        stats = probe.fresh_stats()
        print("franky driver stats (setpoints):", json.dumps(stats))
        assert stats["libfranka_errors"] == 0, stats
        assert stats["connection"] == "connected"
        assert [e["event"] for e in probe.events] == ["unused_interface"], probe.events
    finally:
        if probe is not None:
            probe.close()
        code, out = stop_process(driver) if driver is not None else (None, "")
        stop_process(sim)
    assert code == 0, out[-3000:]
