"""Process entry helper shared by every node: init, a spin_once loop, clean shutdown.

A `spin_once(timeout_sec=…)` loop is used rather than EventsExecutor, which hung in shutdown
on the pip-installed Jazzy wheels. SIGINT and SIGTERM both end the loop, after which the node's
`close()` runs so drivers can leave the arm holding. `DeadlineThread` runs a control loop
outside the executor, on absolute CLOCK_MONOTONIC deadlines.
"""

from __future__ import annotations

import ctypes
import faulthandler
import math
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

import rclpy
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.rcutils_logger import RcutilsLogger
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.teardown import bounded_teardown

SHUTDOWN_REPORT_S = 7.0  # the launcher escalates to SIGTERM after 10 s
TEARDOWN_LIMIT_S = 2.0  # DDS teardown after close(): milliseconds unless Fast DDS deadlocks


def run_node(make_node: Callable[[], Node], argv: list[str] | None = None) -> int:
    """Create the node from `make_node`, spin until SIGINT/SIGTERM, return the exit code.

    The signals are handled here rather than by rclpy: its handler shuts the context down from
    another thread while the loop may be inside a callback or a take, which then fails at
    random (seen in CI as an "unclean stop"). Here a signal only ends the loop, and `close()`
    runs while the context is still valid (a driver can still command a hold). A second signal
    raises KeyboardInterrupt, for a close() that hangs."""
    rclpy.init(
        args=sys.argv if argv is None else argv, signal_handler_options=SignalHandlerOptions.NO
    )
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        # A stop that hangs prints every thread's stack (the launcher keeps an unclean node's
        # last output); faulthandler's watchdog thread needs no GIL, so it works even then.
        faulthandler.dump_traceback_later(SHUTDOWN_REPORT_S, file=sys.stderr)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    node = None
    code = 0
    try:
        try:
            node = make_node()
        except (ValueError, FileNotFoundError) as exc:
            # A bad parameter or a missing file: the reason is the whole story.
            print(f"configuration error: {exc}", file=sys.stderr)
            code = 1
            return code
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        while not stop.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception as exc:
        # A crash the launcher must see as a non-zero exit.
        print(f"[{getattr(node, 'get_name', lambda: '?')()}] fatal: {exc!r}", file=sys.stderr)
        traceback.print_exc()
        code = 1
    finally:
        try:
            close = getattr(node, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    print(f"close failed: {exc!r}", file=sys.stderr)
        finally:
            with bounded_teardown(code, TEARDOWN_LIMIT_S):
                if node is not None:
                    node.destroy_node()
                rclpy.try_shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return code


def private_node(name: str, domain_id: int):
    """(context, node, executor): a node of this process on `domain_id`, in a context of its
    own, spun by the caller. No rclpy signal handlers: Ctrl-C must reach the caller's loop as
    KeyboardInterrupt (which keeps what it has recorded), not shut the context down."""

    context = Context()
    no_handlers = SignalHandlerOptions.NO
    rclpy.init(args=[], context=context, domain_id=domain_id, signal_handler_options=no_handlers)
    node = RuntimeNode(name, context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    return context, node, executor


def close_private_node(owner) -> None:
    """Destroy `owner.node` and shut its `owner.context` down (once; a missing node is fine:
    its creation failed)."""
    node = getattr(owner, "node", None)
    if node is not None:
        node.destroy_node()
        owner.context.try_shutdown()
        owner.node = None


class BackgroundSpinner:
    """Spins nodes in a daemon thread (a spin_once loop) for code that keeps its own main
    thread: the launcher's run monitor, benchmark recorders, tests. Also a context manager."""

    def __init__(self, context, nodes):
        self.executor = SingleThreadedExecutor(context=context)
        for node in nodes:
            self.executor.add_node(node)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def start(self) -> BackgroundSpinner:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.executor.shutdown()

    def __enter__(self) -> BackgroundSpinner:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class ThrottledLog:
    """Calls `log(message)` at most once every `period_s` (monotonic): whatever the message, or
    with `per_message` for each distinct message (a new one is logged at once)."""

    def __init__(self, log, period_s: float = 2.0, per_message: bool = False):
        owner = getattr(log, "__self__", None)
        if isinstance(owner, RcutilsLogger):
            # rclpy fixes the severity of a call site per logger object, and every ThrottledLog
            # logs from one line: an error one and an info one on a node's logger would clash
            # ("Logger severity cannot be changed between calls"). Each gets its own object.
            log = getattr(rclpy.logging.get_logger(owner.name), log.__name__)
        self._log, self._period, self._per_message = log, period_s, per_message
        self._last: dict[str | None, float] = {}

    def __call__(self, message: str) -> bool:
        """True when `message` was logged."""
        key = message if self._per_message else None
        now = time.monotonic()
        if now - self._last.get(key, -math.inf) < self._period:
            return False
        if len(self._last) > 100:  # bounded: messages may carry changing numbers
            self._last.clear()
        self._last[key] = now
        self._log(message)
        return True


CLOCK_MONOTONIC, TIMER_ABSTIME = 1, 1
EINTR = 4


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def absolute_sleeper():
    """sleep_until(deadline_ns on CLOCK_MONOTONIC): clock_nanosleep(TIMER_ABSTIME) through libc
    (no drift from computing relative sleeps), or time.sleep where libc lacks it."""
    try:
        clock_nanosleep = ctypes.CDLL(None, use_errno=True).clock_nanosleep
    except (OSError, AttributeError):
        clock_nanosleep = None

    def sleep_until(deadline_ns: int) -> None:
        if clock_nanosleep is None:
            delay = (deadline_ns - time.monotonic_ns()) * 1e-9
            if delay > 0:
                time.sleep(delay)
            return
        spec = _Timespec(deadline_ns // 1_000_000_000, deadline_ns % 1_000_000_000)
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ctypes.byref(spec), None) == EINTR:
            pass  # a signal arrived; sleep on to the same deadline

    return sleep_until


class DeadlineThread:
    """Calls `tick()` every `period_s` from a daemon thread sleeping to absolute deadlines
    (lowest jitter, wall time). A tick that overruns whole periods skips the missed ticks
    (counted in `overruns`), never bursts to catch up."""

    def __init__(self, period_s: float, tick: Callable[[], None], name: str = "control"):
        self.period_ns = round(period_s * 1e9)
        self.overruns = 0
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> DeadlineThread:
        # The thread must get the GIL back promptly when its deadline comes.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        sleep_until = absolute_sleeper()
        period_ns = self.period_ns
        deadline = time.monotonic_ns() + period_ns
        while not self._stop.is_set():
            sleep_until(deadline)
            if self._stop.is_set():
                break
            self._tick()
            deadline += period_ns
            late = time.monotonic_ns() - deadline
            if late > 0:
                missed = late // period_ns + 1
                self.overruns += missed
                deadline += missed * period_ns
