"""Capture pacing, the capture thread's retries and the camera health it reports."""

import threading
import time

import numpy as np
import pytest

from vla_runtime.drivers.camera_capture import (
    DEFAULT_FILE_FPS,
    ERROR,
    OK,
    WARN,
    CameraHealth,
    CaptureThread,
    FrameSchedule,
)
from vla_runtime.drivers.cameras import CameraUnavailable


class FakeSource:
    """Fails to open `failures` times, then delivers `frames` frames and stops delivering."""

    def __init__(self, has_clock=True, fps=None, failures=0, frames=3):
        self.has_clock, self.fps = has_clock, fps
        self.failures, self.frames = failures, frames
        self.opened = self.closed = 0

    def open(self):
        self.opened += 1
        if self.failures:
            self.failures -= 1
            raise CameraUnavailable("device /dev/video9 does not exist")

    def read(self):
        if self.frames == 0:
            return False, None
        self.frames -= 1
        return True, np.full((2, 2, 3), self.frames % 256, np.uint8)

    def close(self):
        self.closed += 1


def test_a_file_without_fps_is_read_at_the_default_rate_when_due():
    schedule = FrameSchedule.for_source(FakeSource(has_clock=False), 0.0, now=10.0)
    assert schedule.period == pytest.approx(1 / DEFAULT_FILE_FPS)
    assert schedule.wait_s(10.0) == 0.0
    assert schedule.admit(10.0)
    assert schedule.wait_s(10.02) == pytest.approx(1 / 15 - 0.02)
    assert schedule.admit(10.0001)  # a file's frame is never dropped, only waited for


def test_a_device_faster_than_fps_has_its_early_frames_dropped():
    schedule = FrameSchedule.for_source(FakeSource(fps=30.0), 10.0, now=0.0)  # fps caps it
    assert schedule.period == pytest.approx(0.1)
    assert schedule.wait_s(0.0) == 0.0  # a device delivers at its own pace
    assert schedule.admit(0.0)
    assert not schedule.admit(0.033)  # due at 0.1: more than a quarter period early
    assert schedule.admit(0.08)  # within a quarter period: taken, next due at 0.2
    assert not schedule.admit(0.14)
    assert schedule.admit(0.19)


def test_after_a_stall_the_schedule_restarts_instead_of_bursting():
    schedule = FrameSchedule(period=0.1, now=0.0, has_clock=True)
    assert schedule.admit(0.0)
    assert schedule.admit(1.0)  # a second late
    assert schedule.next_due == pytest.approx(0.9)  # not 0.2: the backlog is forgotten
    stream = [1.0 + 0.01 * k for k in range(1, 51)]  # the device then delivers at 100 Hz
    taken = [round(t, 2) for t in stream if schedule.admit(t)]
    assert taken == [1.01, 1.02, 1.08, 1.18, 1.28, 1.38, 1.48]


def test_a_device_without_any_rate_takes_every_frame():
    schedule = FrameSchedule.for_source(FakeSource(fps=None), 0.0, now=0.0)
    assert schedule.period == 0.0
    assert all(schedule.admit(t) for t in (0.0, 0.0, 0.001))


def test_health_reports_rate_of_the_last_30_frames_and_a_calibration_problem():
    health = CameraHealth()
    assert health.status == (WARN, "starting")
    assert health.set_status(OK, "streaming")
    assert not health.set_status(OK, "streaming")  # unchanged
    for k in range(40):
        health.frame_published(0.5 * k if k < 10 else 4.5 + 0.1 * (k - 9))  # 2 Hz, then 10 Hz
    level, message, values = health.report()
    assert (level, message) == (OK, "streaming")
    assert values == {"frames_published": "40", "publish_rate_hz": "10.00"}
    health.calibration_problem = "calibration ignored: bad.yaml: missing camera_matrix"
    level, message, _ = health.report()
    assert level == WARN
    assert message == "streaming; calibration ignored: bad.yaml: missing camera_matrix"
    health.set_status(ERROR, "render failed")
    assert health.report()[0] == ERROR  # worse than the calibration problem stays


def _run(source, until, fps=0.0):
    frames, statuses, done = [], [], threading.Event()

    def on_frame(frame):
        frames.append(int(frame[0, 0, 0]))

    def on_status(level, message):
        statuses.append((level, message))
        if until(statuses):
            done.set()

    thread = CaptureThread(source, fps, 0.01, on_frame, on_status, name="capture-test")
    thread.start()
    assert done.wait(5.0)
    thread.stop()
    assert not thread.is_alive()
    return frames, statuses


def test_capture_retries_a_missing_source_then_streams_and_reports_when_it_stops():
    source = FakeSource(failures=2, frames=3)
    frames, statuses = _run(source, until=lambda s: s[-1][0] == WARN)
    assert statuses[:3] == [
        (ERROR, "device /dev/video9 does not exist; retrying every 0.01 s"),
        (ERROR, "device /dev/video9 does not exist; retrying every 0.01 s"),
        (OK, "streaming"),
    ]
    assert frames == [2, 1, 0]
    assert statuses[3] == (WARN, "stopped delivering frames; retrying every 0.01 s")
    assert source.opened >= 3 and source.closed >= 3


def test_capture_paces_a_file_and_stops_promptly():
    source = FakeSource(has_clock=False, fps=None, frames=1000)
    thread = CaptureThread(source, 20.0, 1.0, lambda f: None, lambda level, m: None)
    start = time.monotonic()
    thread.start()
    time.sleep(0.25)
    thread.stop()
    assert time.monotonic() - start < 1.0
    assert 2 <= 1000 - source.frames <= 7  # 20 Hz for 0.25 s: ~6 frames, not a disk's worth
