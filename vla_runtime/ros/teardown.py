"""A deadline on a node's DDS teardown that holds even when the teardown holds the GIL.

Fast DDS can deadlock while deleting a writer or reader (its timer thread against the
deleting thread: eProsima/Fast-DDS#6193, #6502). rclpy's destroy calls keep the GIL while they
wait, so no Python thread or signal handler can end such a process; a POSIX timer whose
expiry runs `_exit` on a native thread can. By then the node's `close()` has run (a driver has
left the arm holding), so ending the process with the node's own exit code loses nothing.
"""

from __future__ import annotations

import ctypes
import faulthandler
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_LIBC = ctypes.CDLL(None, use_errno=True)
_SIGEV_THREAD = 2
_CLOCK_MONOTONIC = 1


class _SigEvent(ctypes.Structure):
    # glibc's struct sigevent (64 bytes) with its SIGEV_THREAD members.
    _fields_ = [
        ("value", ctypes.c_void_p),
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("function", ctypes.c_void_p),
        ("attribute", ctypes.c_void_p),
        ("pad", ctypes.c_int * 8),
    ]


class _TimeSpec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("interval", _TimeSpec), ("value", _TimeSpec)]


def _arm(exit_code: int, after_s: float) -> ctypes.c_void_p | None:
    """A one-shot timer that calls `_exit(exit_code)` after `after_s`; None if not armed."""
    # sigev_value (a union of int and pointer) is passed in the first argument register,
    # which `_exit` reads as its int status.
    event = _SigEvent(value=exit_code & 0xFF, notify=_SIGEV_THREAD,
                      function=ctypes.cast(_LIBC._exit, ctypes.c_void_p))  # fmt: skip
    timer = ctypes.c_void_p()
    if _LIBC.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
        return None
    whole = int(after_s)
    expiry = _ITimerSpec(value=_TimeSpec(whole, int((after_s - whole) * 1e9)))
    if _LIBC.timer_settime(timer, 0, ctypes.byref(expiry), None) != 0:
        _LIBC.timer_delete(timer)
        return None
    return timer


@contextmanager
def bounded_teardown(exit_code: int, limit_s: float) -> Iterator[None]:
    """Run the body (DDS teardown); if it has not returned after `limit_s`, every thread's
    stack goes to stderr and the process ends with `exit_code`."""
    sys.stdout.flush()
    sys.stderr.flush()
    faulthandler.dump_traceback_later(max(limit_s - 0.2, 0.05), file=sys.stderr)
    timer = _arm(exit_code, limit_s)
    try:
        yield
    finally:
        if timer is not None:
            _LIBC.timer_delete(timer)
        faulthandler.cancel_dump_traceback_later()
