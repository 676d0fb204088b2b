"""How the direct Franka driver streams targets to franky, as pure logic (no ROS, no franky).

Every new target is a libfranka Move command (a TCP round trip and a re-plan), so the driver
reads and publishes the state at `state_rate_hz` and hands franky a target only at
`stream_rate_hz` of the robot's clock, and only when it differs from the last one sent.
`StreamStats` keeps the figures the driver reports on /vla/driver/stats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.direct_driver import LIBFRANKA_ERROR_KINDS, classify_libfranka_error
from vla_runtime.core.rates import STATE_RATE_HZ
from vla_runtime.core.stats import Reservoir

REALTIME_CONFIGS = ("enforce", "ignore")  # libfranka's RealtimeConfig
MAX_STATE_RATE_HZ = 1000.0  # libfranka's control rate


@dataclass(frozen=True)
class StreamConfig:
    stream_rate_hz: float = 50.0  # targets handed to franky
    state_rate_hz: float = STATE_RATE_HZ  # state reads (and /joint_states)
    lookahead_s: float = 0.1  # how far ahead of now each target is sampled
    relative_dynamics_factor: float = 1.0  # franky's scale of velocity, acceleration and jerk
    realtime_config: str = "enforce"  # one of REALTIME_CONFIGS

    def problem(self) -> str | None:
        """Why these settings are not acceptable (the first reason), or None."""
        if self.realtime_config not in REALTIME_CONFIGS:
            return f"realtime_config must be enforce or ignore, got {self.realtime_config!r}"
        factor = self.relative_dynamics_factor
        if not 0.0 < factor <= 1.0:
            return f"relative_dynamics_factor must be in (0, 1], got {factor}"
        if not 1.0 <= self.stream_rate_hz <= self.state_rate_hz <= MAX_STATE_RATE_HZ:
            return (
                f"need 1 <= stream_rate_hz ({self.stream_rate_hz}) <= state_rate_hz "
                f"({self.state_rate_hz}) <= {MAX_STATE_RATE_HZ:g}"
            )
        return None

    def validated(self) -> StreamConfig:
        problem = self.problem()
        if problem is not None:
            raise ValueError(problem)
        return self


class TargetStream:
    """The streaming thread's ticks, one per state read at the config's `state_rate_hz` of wall
    time (after an overrun a fresh schedule starts instead of a burst). A tick also hands franky
    the target, if it is new, once per `stream_rate_hz` period of the robot's clock: the node's,
    which in a dry run is the simulator's time. franky-sim runs slower than wall time on a busy
    host, and every target restarts franky's motion from the commanded state, so targets paced
    by wall time would reach that arm several times per period and hold it back. The clock's
    time between targets goes to `periods`."""

    def __init__(self, config: StreamConfig, periods: Reservoir):
        self.period_s = 1.0 / config.state_rate_hz
        self.target_period_s = 1.0 / config.stream_rate_hz
        self._periods = periods
        self._next_tick: float | None = None
        self._next_target = -math.inf
        self._last_target: float | None = None
        self._last_sent: np.ndarray | None = None

    def tick(self, now: float, clock: float | None = None) -> bool:
        """A tick at wall time `now` (s), the robot's clock reading `clock` (default `now`):
        whether it hands franky a target."""
        clock = now if clock is None else clock
        if self._next_tick is None:
            self._next_tick = now
        last = self._last_target
        # The first target, or one after the clock restarted: a fresh grid.
        fresh = last is None or clock < last
        if not fresh:
            # Due within half a state tick of the grid.
            if clock < self._next_target - self.period_s / 2:
                return False
            self._periods.add(clock - last)
        # After an overrun a fresh grid starts too.
        overran = self._next_target + self.target_period_s <= clock
        grid = clock if fresh or overran else self._next_target
        self._last_target = clock
        self._next_target = grid + self.target_period_s
        return True

    def wait_s(self, now: float) -> float:
        """After a tick, at `now`: how long to wait for the next one (0: it is due)."""
        self._next_tick += self.period_s
        delay = self._next_tick - now
        if delay > 0:
            return delay
        self._next_tick = now  # overran
        return 0.0

    def is_new(self, target: np.ndarray) -> bool:
        return self._last_sent is None or not np.array_equal(target, self._last_sent)

    def sent(self, target: np.ndarray) -> None:
        self._last_sent = target

    def forget(self) -> None:
        """After an error or while disconnected: the next target goes out, whatever it is."""
        self._last_sent = None


def _milliseconds(summary: dict) -> dict:
    return {k: None if v is None else v * 1e3 for k, v in summary.items() if k != "n"}


class StreamStats:
    """libfranka errors by kind, the period between targets, how long a move call takes,
    and the tracking error while the arm is meant to follow its setpoint."""

    def __init__(self, stream_rate_hz: float):
        self.stream_rate_hz = stream_rate_hz
        self.errors = dict.fromkeys(LIBFRANKA_ERROR_KINDS, 0)
        self.periods, self.move_calls, self.tracking = Reservoir(), Reservoir(), Reservoir()

    def libfranka_error(self, message: str) -> str:
        """Count the libfranka error `message` reports; returns its kind."""
        kind = classify_libfranka_error(message)
        self.errors[kind] += 1
        return kind

    def tracked(self, measured: np.ndarray, desired: np.ndarray) -> None:
        self.tracking.add(float(np.max(np.abs(measured - desired))))

    def report(self, gripper_calls: dict, gripper_width_m: float, connection: str) -> dict:
        """The /vla/driver/stats figures (times in ms), with the gripper's and the connection's."""
        periods, moves, tracking = (
            r.summary() for r in (self.periods, self.move_calls, self.tracking)
        )
        return {
            "libfranka_errors": sum(self.errors.values()),
            "libfranka_errors_by_kind": dict(self.errors),
            "stream_period_ms": _milliseconds(periods),
            "stream_period_target_ms": 1e3 / self.stream_rate_hz,
            "move_call_ms": _milliseconds(moves),
            "tracking_error_rad": {k: v for k, v in tracking.items() if k != "n"},
            "gripper_calls": dict(gripper_calls),
            "gripper_width_m": gripper_width_m,
            "connection": connection,
        }
