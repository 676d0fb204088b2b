"""Capturing a device or file camera (no ROS): `CaptureThread` reads it, paced by a
`FrameSchedule`, and reopens it when it fails; `CameraHealth` is what a camera node reports on
/diagnostics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from vla_runtime.core.stats import RateMeter
from vla_runtime.drivers.cameras import CameraUnavailable, DeviceSource, VideoFileSource

DEFAULT_FILE_FPS = 15.0  # files whose fps is unknown
# diagnostic_msgs/DiagnosticStatus levels, as the message holds them
OK, WARN, ERROR = b"\x00", b"\x01", b"\x02"


class FrameSchedule:
    """When the capture loop takes a frame of a device or file, at most one per `period`.

    A file has no clock of its own: its frames are read when due (`wait_s`). A device delivers
    at its own rate: a frame more than a quarter period early is dropped (`admit`)."""

    def __init__(self, period: float, now: float, has_clock: bool) -> None:
        self.period, self.next_due, self.has_clock = period, now, has_clock

    @classmethod
    def for_source(
        cls, source: DeviceSource | VideoFileSource, fps: float, now: float
    ) -> FrameSchedule:
        """The schedule of a just opened source: `fps`, else the source's own rate."""
        rate = fps or source.fps
        if not rate and not source.has_clock:
            rate = DEFAULT_FILE_FPS  # never read a file as fast as the disk allows
        return cls(1.0 / rate if rate else 0.0, now, source.has_clock)

    def wait_s(self, now: float) -> float:
        """How long to wait before reading the next frame."""
        return 0.0 if self.has_clock else max(0.0, self.next_due - now)

    def admit(self, now: float) -> bool:
        """Whether the frame read at `now` is published (taking the next slot) or dropped."""
        if self.has_clock and self.period and now < self.next_due - 0.25 * self.period:
            return False  # the device runs faster than `fps`
        # Next slot one period on; after a stall restart the schedule instead of bursting.
        self.next_due = max(self.next_due + self.period, now - self.period)
        return True


class CaptureThread(threading.Thread):
    """Reads a device or file source, paced at `fps` (0: its own rate), and hands each frame to
    `on_frame(frame)`. A source that cannot be opened or stops delivering is reported to
    `on_status(level, message)` (ERROR when it never opened, WARN when it stopped) and reopened
    every `retry_period_s` until `stop()`, or until `alive()` is false."""

    def __init__(
        self,
        source: DeviceSource | VideoFileSource,
        fps: float,
        retry_period_s: float,
        on_frame: Callable[[np.ndarray], None],
        on_status: Callable[[bytes, str], None],
        alive: Callable[[], bool] = lambda: True,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.source, self.fps, self.retry_period_s = source, fps, retry_period_s
        self._on_frame, self._on_status, self._alive = on_frame, on_status, alive
        self._stop_event = threading.Event()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=timeout)

    def run(self) -> None:
        source, stop = self.source, self._stop_event
        schedule: FrameSchedule | None = None  # None while the source is not open
        while not stop.is_set():
            try:
                if schedule is None:
                    source.open()
                    schedule = FrameSchedule.for_source(source, self.fps, time.monotonic())
                    self._on_status(OK, "streaming")
                if stop.wait(schedule.wait_s(time.monotonic())):
                    break
                ok, frame = source.read()
                if not ok:
                    raise CameraUnavailable("stopped delivering frames")
                if schedule.admit(time.monotonic()):
                    self._on_frame(frame)
            except Exception as exc:
                if stop.is_set() or not self._alive():
                    break
                source.close()
                level = ERROR if schedule is None else WARN
                schedule = None
                self._on_status(level, f"{exc}; retrying every {self.retry_period_s:g} s")
                stop.wait(self.retry_period_s)
        source.close()


class CameraHealth:
    """What a camera reports on /diagnostics, shared by its capture thread and its node: the
    source's status (level, message), a calibration problem (which makes the report at least a
    warning) and the frames published, with their rate over the last 30."""

    def __init__(self) -> None:
        self.calibration_problem = ""
        self._lock = threading.Lock()
        self._status = (WARN, "starting")
        self._published = RateMeter(window=30)

    @property
    def status(self) -> tuple[bytes, str]:
        with self._lock:
            return self._status

    def set_status(self, level: bytes, message: str) -> bool:
        """Whether this changes the status."""
        with self._lock:
            changed = self._status != (level, message)
            self._status = (level, message)
        return changed

    def frame_published(self, t: float) -> None:
        with self._lock:
            self._published.add(t)

    def report(self) -> tuple[bytes, str, dict[str, str]]:
        """(level, message, values) for the diagnostics."""
        with self._lock:
            level, message = self._status
            rate, frames = self._published.rate_hz, self._published.count
        if self.calibration_problem:
            level = max(level, WARN)
            message = f"{message}; {self.calibration_problem}"
        return level, message, {"frames_published": str(frames), "publish_rate_hz": f"{rate:.2f}"}
