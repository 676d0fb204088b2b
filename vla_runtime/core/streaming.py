"""Latency-aware streaming of action chunks (docs/design.md §4), pure logic without ROS.

Time model: all times are seconds on one clock (ROS time). A command produced at control time
`now` takes effect at the command time t_c = now + driver_delay. An action of a chunk computed
from the observation at t_obs is meant for T_k = t_obs + time_from_start_k; it is stale when
T_k < t_c: it can no longer be applied on time, so the stale prefix is dropped and counted.

The plan is a C1 cubic Hermite spline through timed knots (positions + velocities): the chunk's
actions with finite-difference velocities, plus an anchor knot at the hand-over. A merge keeps
the old plan up to the first usable new action and blends old into new over the overlap (at
most `blend_window_s`) with a quintic smooth-step weight w; blending both positions and
velocities (including the w' term) keeps position and velocity continuous at both ends of the
window. Each control tick samples the plan at t_c and a jerk-limited tracker (ruckig) turns it
into the command; when the plan has run dry the tracker brakes to a stop within the limits
(never extrapolates).

Speed scaling (the UR speed slider, core/speed_scaling.py): the plan lives on plan time tau,
which advances at s x real time (`PlanClock`; tau = t while s has always been 1). Plan-side
quantities (knot times, T_k, the stale test, blend windows, the remaining plan) are plan time;
wall-side ones (command stamps, request timeouts, the delay in executed ticks) stay real time.
A chunk observed at t_obs is anchored at tau(t_obs), the plan time the arm was at when the
images were taken, so action k is stale when tau(t_obs) + t_k < tau(t_c): during an inference
delay D only s*D of plan passes, so at s < 1 a shorter prefix is stale and at s = 0 none. Dropping
by wall time instead would throw away actions the slowed arm has not reached yet. The request
threshold compares the remaining plan with s x (expected delay + margin) for the same reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vla_runtime.core.delay import DelayEstimator
from vla_runtime.core.interpolation import JerkLimitedTracker, Limits, MotionState
from vla_runtime.core.speed_scaling import PlanClock
from vla_runtime.core.stats import Reservoir

MODES = ("async", "sync")
REQUEST_POLICIES = ("threshold", "continuous")
_EPS = 1e-9
SMOOTHSTEP_PEAK_SLOPE = 1.875  # max of w'(s)
SMOOTHSTEP_PEAK_CURVATURE = 10.0 / math.sqrt(3.0)  # max of |w''(s)|


def smoothstep(s):
    """Quintic weight 10s³ - 15s⁴ + 6s⁵ on [0, 1] (clamped), and its derivative in s.

    w, w' and w'' vanish at 0 and w' and w'' at 1, so blending with it adds no velocity or
    acceleration step at either end of the window."""
    s = np.clip(s, 0.0, 1.0)
    w = s**3 * (10.0 + s * (-15.0 + 6.0 * s))
    dw = 30.0 * s**2 * (1.0 - s) ** 2
    return w, dw


def finite_difference_velocities(times: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Knot velocities: second-order central differences inside (non-uniform spacing allowed),
    one-sided at the ends, zero for a single knot."""
    n = len(times)
    velocities = np.zeros_like(positions)
    if n < 2:
        return velocities
    h = np.diff(times)[:, None]
    slopes = np.diff(positions, axis=0) / h
    velocities[0] = slopes[0]
    velocities[-1] = slopes[-1]
    if n > 2:
        h_prev, h_next = h[:-1], h[1:]
        velocities[1:-1] = (slopes[1:] * h_prev + slopes[:-1] * h_next) / (h_prev + h_next)
    return velocities


class Plan:
    """Timed knots with a C1 cubic Hermite interpolant. `is_action` marks knots that are
    actions of a chunk (counted when executed); `executed` marks those already passed."""

    def __init__(self, times, positions, velocities, is_action, executed=None):
        self.times = np.asarray(times, dtype=float)
        self.positions = np.asarray(positions, dtype=float)
        self.velocities = np.asarray(velocities, dtype=float)
        self.is_action = np.asarray(is_action, dtype=bool)
        n = len(self.times)
        self.executed = np.zeros(n, bool) if executed is None else np.asarray(executed, bool)
        if not (self.positions.shape == self.velocities.shape and self.positions.shape[0] == n):
            raise ValueError("plan arrays disagree in length")
        if n == 0 or np.any(np.diff(self.times) <= 0):
            raise ValueError("plan times must be strictly increasing and non-empty")
        self.next_index = 0  # first knot not yet passed by the command time

    @property
    def start_time(self) -> float:
        return float(self.times[0])

    @property
    def end_time(self) -> float:
        return float(self.times[-1])

    def sample(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Position, velocity and acceleration at t (clamped to the plan's span)."""
        times = self.times
        if t <= times[0]:
            return self.positions[0], self.velocities[0], np.zeros_like(self.positions[0])
        if t >= times[-1]:
            return self.positions[-1], self.velocities[-1], np.zeros_like(self.positions[0])
        i = int(np.searchsorted(times, t, side="right")) - 1
        h = times[i + 1] - times[i]
        s = (t - times[i]) / h
        p0, p1 = self.positions[i], self.positions[i + 1]
        m0, m1 = self.velocities[i] * h, self.velocities[i + 1] * h
        s2, s3 = s * s, s * s * s
        position = (
            (2 * s3 - 3 * s2 + 1) * p0 + (s3 - 2 * s2 + s) * m0 + (3 * s2 - 2 * s3) * p1
            + (s3 - s2) * m1
        )  # fmt: skip
        velocity = ((6 * s2 - 6 * s) * (p0 - p1) + (3 * s2 - 4 * s + 1) * m0
                    + (3 * s2 - 2 * s) * m1) / h  # fmt: skip
        acceleration = ((12 * s - 6) * (p0 - p1) + (6 * s - 4) * m0 + (6 * s - 2) * m1) / h**2
        return position, velocity, acceleration


@dataclass
class StreamerConfig:
    control_period_s: float = 0.004
    mode: str = "async"
    request_policy: str = "threshold"
    margin_steps: int = 25
    blend_window_s: float = 0.1
    driver_delay_s: float = 0.0
    warmup_requests: int = 3
    request_timeout_s: float = 2.0
    # A chunk stamped further in the future than this is a clock mismatch, not a chunk.
    max_future_s: float = 0.5

    def __post_init__(self):
        if not (math.isfinite(self.control_period_s) and self.control_period_s > 0):
            raise ValueError(f"control_period_s must be > 0, got {self.control_period_s}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.request_policy not in REQUEST_POLICIES:
            raise ValueError(
                f"request_policy must be one of {REQUEST_POLICIES}, got {self.request_policy!r}"
            )
        for name in ("blend_window_s", "driver_delay_s", "request_timeout_s", "max_future_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.margin_steps < 0 or self.warmup_requests < 0:
            raise ValueError("margin_steps and warmup_requests must be >= 0")


@dataclass
class MergeResult:
    accepted: bool
    reason: str = ""
    stale_dropped: int = 0
    blend_window_s: float = 0.0
    delay_steps: int | None = None


@dataclass
class Request:
    """An inference request: the plan still to run, times relative to `stamp`."""

    request_id: int
    stamp: float
    times_from_start: np.ndarray
    positions: np.ndarray


@dataclass
class Setpoint:
    time: float  # the command time this setpoint is for
    position: np.ndarray
    velocity: np.ndarray
    acceleration: np.ndarray
    holding: bool


@dataclass
class _Handover:
    until: float  # command time at which the blend window ends
    measured: bool  # False for the start-up chunk (not a chunk boundary)
    jump: float = 0.0


@dataclass
class _Counters:
    steps: int = 0
    executed_actions: int = 0
    stale_dropped: int = 0
    stale_executed: int = 0
    empty_plan_ticks: int = 0
    startup_ticks: int = 0
    paused_ticks: int = 0  # speed scaling 0: the plan stands still (not a starved plan)
    chunks_accepted: int = 0
    chunks_rejected: int = 0
    requests_sent: int = 0
    requests_timed_out: int = 0
    requests_refused: int = 0
    resyncs: int = 0
    last_rejection: str = ""
    handover_jumps: Reservoir = field(default_factory=lambda: Reservoir(2000))
    within_changes: Reservoir = field(default_factory=lambda: Reservoir(20000))


class ActionStreamer:
    """Plan, merge, request policy, hold and metrics for one arm (+ gripper column).

    Call `tick(now)` once per control period, `merge_chunk(...)` when a chunk arrives and
    `want_request(now)` / `make_request(now)` to drive inference requests.
    """

    def __init__(self, config: StreamerConfig, limits: Limits, initial_position, arm_dof=None):
        self.config = config
        self.tracker = JerkLimitedTracker(limits)
        self.delay = DelayEstimator(warmup=config.warmup_requests)
        self.state = MotionState.at_rest(initial_position)
        if self.state.position.shape != (limits.dof,):
            raise ValueError(f"initial position has {self.state.position.shape}, "
                             f"limits {limits.dof} joints")  # fmt: skip
        self.dof = limits.dof
        self.arm_dof = self.dof if arm_dof is None else arm_dof
        self.plan: Plan | None = None
        self.counters = _Counters()
        self.clock = PlanClock()
        self._speed = 1.0  # latest speed fraction; the clock takes it at the next tick
        self.last_command_time: float | None = None
        self.last_plan_time: float | None = None  # plan time at last_command_time
        self._next_request_id = 1
        self._pending: tuple[int, float] | None = None  # (request id, sent at)
        self._handover: _Handover | None = None
        self._holding = True

    # ------------------------------------------------------------------ control tick

    def set_speed_scaling(self, fraction: float) -> None:
        """The speed fraction s in [0, 1] (UR speed slider): from the next tick on, plan time
        advances at s x real time; s = 0 pauses the plan where it is."""
        if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
            raise ValueError(f"speed scaling must be in [0, 1], got {fraction}")
        self._speed = float(fraction)

    @property
    def speed_scaling(self) -> float:
        return self._speed

    def tick(self, now: float) -> Setpoint:
        """Advance the command to the command time now + driver_delay."""
        c = self.counters
        period = self.config.control_period_s
        t_c = now + self.config.driver_delay_s
        previous = self.last_command_time
        if previous is not None and t_c <= previous:  # clock did not advance (or went back)
            return self._setpoint(previous)
        dt = period if previous is None else min(t_c - previous, 10.0 * period)
        # The latest speed governs the interval this tick advances over, (previous, t_c].
        scale_before = self.clock.scale
        self.clock.set_scale(self._speed, t_c if previous is None else previous)
        scale = self.clock.scale
        tau_c = self.clock.at(t_c)
        tau_previous = self.last_plan_time
        previous_velocity = self.state.velocity
        plan = self.plan
        if plan is not None and tau_c <= plan.end_time:
            self._count_executed(plan, tau_previous, tau_c)
            reference, t_end = self._reference(plan, t_c, tau_c, scale)
            self.state = self.tracker.track(self.state, reference, t_c - dt, dt, t_end)
            self._holding = False
        else:
            if plan is not None:
                self._count_executed(plan, tau_previous, tau_c)
                if scale > 0.0:  # a paused plan is not a starved one
                    c.empty_plan_ticks += 1
            else:
                c.startup_ticks += 1
            self.state = self.tracker.brake(self.state, dt)
            self._holding = True
        if scale == 0.0:
            c.paused_ticks += 1
        self.last_command_time = t_c
        self.last_plan_time = tau_c
        c.steps += 1
        # Slowing down and pausing change the velocity on purpose: not a smoothness sample.
        steady = scale == scale_before and scale > 0.0
        if previous is not None and not self._holding and steady:
            self._record_velocity_change(previous_velocity, dt, tau_c)
        return self._setpoint(t_c)

    @staticmethod
    def _reference(plan: Plan, t_c: float, tau_c: float, scale: float):
        """The plan as the tracker sees it, a function of command time, and its end: plan time
        runs at `scale`, so velocities scale by s and accelerations by s^2. Paused (s = 0), it
        is the standing plan point: the command stops there within the limits (from speed it
        overshoots by about v^2 / 2a and comes back, as any position target would)."""
        if scale == 1.0 and tau_c == t_c:
            return plan.sample, plan.end_time

        def sample(t):
            p, v, a = plan.sample(tau_c + scale * (t - t_c))
            return p, scale * v, (scale * scale) * a

        t_end = None if scale == 0.0 else t_c + (plan.end_time - tau_c) / scale
        return sample, t_end

    def resync(
        self, measured_arm, measured_velocity, tolerance: float, rest_speed: float = 0.01
    ) -> bool:
        """While the command holds at rest and the arm has come to rest too, but more than
        `tolerance` (rad) away from it, move the held command to the arm: the safety gate stopped
        the arm (timeout, e-stop) short of where the plan left the command, and a gate only
        re-arms on a command that agrees with the arm. Never while a plan runs or the arm still
        moves towards the command (it lags legitimately)."""
        measured = np.asarray(measured_arm, dtype=float)
        held = self.state.position[: self.arm_dof]
        command_at_rest = not np.any(self.state.velocity)
        arm_at_rest = np.max(np.abs(measured_velocity), initial=0.0) <= rest_speed
        if not (self._holding and command_at_rest and arm_at_rest):
            return False
        if np.max(np.abs(measured - held)) <= tolerance:
            return False
        position = self.state.position.copy()
        position[: self.arm_dof] = measured
        self.state = MotionState.at_rest(position)
        self.plan = None
        self.counters.resyncs += 1
        return True

    def _setpoint(self, t: float) -> Setpoint:
        s = self.state
        return Setpoint(t, s.position, s.velocity, s.acceleration, self._holding)

    def _count_executed(self, plan: Plan, previous: float | None, t_c: float) -> None:
        """Actions whose time the command's plan time t_c has now reached. One whose time had
        already passed at the previous tick is executed late: counted as stale executed."""
        c = self.counters
        i = plan.next_index
        times = plan.times
        while i < len(times) and times[i] <= t_c:
            if plan.is_action[i] and not plan.executed[i]:
                plan.executed[i] = True
                if previous is not None and times[i] < previous:
                    c.stale_executed += 1
                else:
                    c.executed_actions += 1
            i += 1
        plan.next_index = i

    def _record_velocity_change(self, previous_velocity, dt: float, t_c: float) -> None:
        # Per-tick velocity change of the arm, scaled to the nominal period so that a late
        # tick does not look like a jump.
        n = self.arm_dof
        change = np.linalg.norm(self.state.velocity[:n] - previous_velocity[:n])
        change *= self.config.control_period_s / dt
        handover = self._handover
        if handover is not None:
            handover.jump = max(handover.jump, float(change))
            if t_c >= handover.until:
                self._close_handover()
            return
        self.counters.within_changes.add(float(change))

    def _close_handover(self) -> None:
        handover = self._handover
        if handover is not None and handover.measured:
            self.counters.handover_jumps.add(handover.jump)
        self._handover = None

    # ------------------------------------------------------------------ chunks

    def merge_chunk(
        self,
        now: float,
        t_obs: float,
        times_from_start,
        positions,
        request_id: int | None = None,
    ) -> MergeResult:
        """Merge a chunk received at `now`. Bad input is rejected with a reason; the plan is
        then unchanged (and holds when it runs dry)."""
        delay_steps = self._answer(request_id)
        result = self._merge(now, t_obs, times_from_start, positions)
        result.delay_steps = delay_steps
        if result.accepted:
            self.counters.chunks_accepted += 1
        else:
            self.counters.chunks_rejected += 1
            self.counters.last_rejection = result.reason
        return result

    def _answer(self, request_id: int | None) -> int | None:
        """The pending request is answered by a chunk carrying its id, or by one without any id
        (an engine that answers each request once but does not echo ids)."""
        if self._pending is None:
            return None
        pending_id = self._pending[0]
        if request_id is not None and request_id != pending_id:
            return self.delay.answered(request_id, self.counters.steps)  # late answer: no-op
        self._pending = None
        return self.delay.answered(pending_id, self.counters.steps)

    def _merge(self, now, t_obs, times_from_start, positions) -> MergeResult:
        cfg = self.config
        tfs = np.asarray(times_from_start, dtype=float).reshape(-1)
        positions = np.asarray(positions, dtype=float)
        if tfs.size == 0:
            return MergeResult(False, "empty chunk")
        if positions.shape != (tfs.size, self.dof):
            return MergeResult(False, f"chunk positions {positions.shape}, expected "
                                      f"{(tfs.size, self.dof)}")  # fmt: skip
        if not (math.isfinite(t_obs) and np.all(np.isfinite(tfs))):
            return MergeResult(False, "non-finite chunk times")
        bad = ~np.all(np.isfinite(positions), axis=1)
        if bad.any():
            return MergeResult(False, f"non-finite actions at {np.flatnonzero(bad).tolist()}")
        if np.any(tfs < 0) or np.any(np.diff(tfs) <= 0):
            return MergeResult(False, "time_from_start must be >= 0 and strictly increasing")
        if t_obs > now + cfg.max_future_s:
            return MergeResult(False, f"chunk stamp {t_obs - now:.3f} s in the future")
        t_c = now + cfg.driver_delay_s
        if self.last_command_time is not None:
            t_c = max(t_c, self.last_command_time)
        # From here on plan time: the command's, and the observation's (see the module doc).
        t_c, t_obs = self.clock.at(t_c), self.clock.at(t_obs)
        if cfg.mode == "sync":
            # Baseline semantics (openpi-style): the arm waited for this chunk, so it runs
            # whole, re-timed to start now, instead of skipping what the wait made late.
            t_obs = max(t_obs, t_c - tfs[0])
        times = t_obs + tfs
        first = int(np.searchsorted(times, t_c, side="left"))  # first action with T >= t_c
        self.counters.stale_dropped += first
        if first == len(times):
            return MergeResult(False, f"all {first} actions stale (last {t_c - times[-1]:.3f} s "
                                      "late)", stale_dropped=first)  # fmt: skip
        # Velocities from the whole chunk, so the first kept action's velocity also uses the
        # dropped one before it.
        velocities = finite_difference_velocities(times, positions)[first:]
        times, positions = times[first:], positions[first:].copy()
        window = self._blend(t_c, times, positions, velocities)
        self._install(t_c, times, positions, velocities)
        self._close_handover()
        self._handover = _Handover(
            until=times[0] + window, measured=self.counters.chunks_accepted > 0
        )
        return MergeResult(True, stale_dropped=first, blend_window_s=window)

    def _blend(self, t_c, times, positions, velocities) -> float:
        """Blend the old plan (or the held position) into the new actions in place; returns the
        window used: the overlap with the old plan, at most blend_window_s; the full window
        when starting from a hold."""
        old = self.plan
        window = self.config.blend_window_s
        start = times[0]
        if old is not None and old.end_time > t_c:
            window = min(window, max(0.0, old.end_time - start))
            sample = old.sample
        else:
            hold = self.state.position.copy()
            zeros = np.zeros_like(hold)
            window = max(window, self._startup_window(positions[0] - hold, velocities[0]))

            def sample(_t):
                return hold, zeros, None

        if window <= _EPS:
            return 0.0
        inside = np.flatnonzero(times < start + window)
        for k in inside:
            w, dw = smoothstep((times[k] - start) / window)
            old_p, old_v, _ = sample(times[k])
            gap = positions[k] - old_p
            positions[k] = old_p + w * gap
            velocities[k] = old_v + w * (velocities[k] - old_v) + (dw / window) * gap
        return window

    def _startup_window(self, gap: np.ndarray, velocity: np.ndarray) -> float:
        """Long enough that blending in from a standstill a chunk that starts `gap` away and
        moves at `velocity` stays within the acceleration limit: the blend adds about
        w''·gap/W² + 2·w'·velocity/W (peaks w' = 1.875, |w''| = 5.774), so the first move after a
        hold does not saturate the limits (no start-up jerk)."""
        a = self.tracker.limits.acceleration
        gap, speed = np.abs(gap), np.abs(velocity)
        b = 2.0 * SMOOTHSTEP_PEAK_SLOPE * speed
        windows = (b + np.sqrt(b * b + 4.0 * a * SMOOTHSTEP_PEAK_CURVATURE * gap)) / (2.0 * a)
        return float(np.max(windows))

    def _install(self, t_c, times, positions, velocities) -> None:
        """New plan = anchor at t_c (the current reference, or the held command) + the old
        plan's knots before the first new action + the new actions."""
        old = self.plan
        if old is not None and old.end_time > t_c:
            anchor_p, anchor_v, _ = old.sample(t_c)
            keep = (old.times > t_c + _EPS) & (old.times < times[0] - _EPS)
            prefix = (old.times[keep], old.positions[keep], old.velocities[keep],
                      old.is_action[keep], old.executed[keep])  # fmt: skip
        else:
            anchor_p, anchor_v = self.state.position.copy(), np.zeros(self.dof)
            prefix = (np.empty(0), np.empty((0, self.dof)), np.empty((0, self.dof)),
                      np.empty(0, bool), np.empty(0, bool))  # fmt: skip
        parts_t, parts_p, parts_v, parts_a, parts_e = [], [], [], [], []
        if times[0] - t_c > _EPS and (len(prefix[0]) == 0 or prefix[0][0] - t_c > _EPS):
            parts_t.append([t_c])
            parts_p.append([anchor_p])
            parts_v.append([anchor_v])
            parts_a.append([False])
            parts_e.append([False])
        for bucket, values in zip((parts_t, parts_p, parts_v, parts_a, parts_e), prefix,
                                  strict=True):  # fmt: skip
            bucket.append(values)
        n = len(times)
        parts_t.append(times)
        parts_p.append(positions)
        parts_v.append(velocities)
        parts_a.append(np.ones(n, bool))
        parts_e.append(np.zeros(n, bool))
        self.plan = Plan(
            np.concatenate(parts_t),
            np.concatenate([np.reshape(p, (-1, self.dof)) for p in parts_p]),
            np.concatenate([np.reshape(v, (-1, self.dof)) for v in parts_v]),
            np.concatenate(parts_a),
            np.concatenate(parts_e),
        )

    # ------------------------------------------------------------------ requests

    def remaining_steps(self) -> int:
        """Whole control steps of plan left after the last command time."""
        if self.plan is None or self.last_plan_time is None:
            return 0
        left = self.plan.end_time - self.last_plan_time
        return max(0, int(math.floor(left / self.config.control_period_s + _EPS)))

    def want_request(self, now: float) -> bool:
        cfg = self.config
        if self._pending is not None:
            request_id, sent_at = self._pending
            if now - sent_at <= cfg.request_timeout_s:
                return False
            self.delay.forget(request_id)
            self._pending = None
            self.counters.requests_timed_out += 1
        remaining = self.remaining_steps()
        if cfg.mode == "sync":
            return remaining == 0
        scale = self._speed
        if scale == 0.0:  # paused: the plan does not shrink, nothing to plan ahead for
            return False
        if cfg.request_policy == "continuous":
            return True
        # At speed s the remaining plan lasts remaining / s control steps.
        return remaining < scale * (self.delay.expected_steps() + cfg.margin_steps)

    def request_refused(self, request_id: int) -> bool:
        """The chunk answering `request_id` will not come (the safety node vetoed it): the next
        request may go out at once instead of after `request_timeout_s` of a starving plan.
        Returns whether it was the pending request."""
        if self._pending is None or self._pending[0] != request_id:
            return False
        self._pending = None
        self.delay.forget(request_id)
        self.counters.requests_refused += 1
        return True

    def make_request(self, now: float) -> Request:
        """Register a request going out now; carries the actions not yet executed."""
        request_id = self._next_request_id
        self._next_request_id += 1
        self._pending = (request_id, now)
        self.delay.sent(request_id, self.counters.steps)
        self.counters.requests_sent += 1
        plan = self.plan
        if plan is None or self.last_plan_time is None:
            times, positions = np.empty(0), np.empty((0, self.dof))
        else:
            # Plan time relative to the plan time at `now` (= now - stamp while s is 1).
            left = plan.is_action & (plan.times > self.last_plan_time)
            times, positions = plan.times[left] - self.clock.at(now), plan.positions[left]
        return Request(request_id, now, times, positions)

    @property
    def pending_request(self) -> int | None:
        return None if self._pending is None else self._pending[0]

    # ------------------------------------------------------------------ metrics

    def metrics(self) -> dict:
        c = self.counters
        handover = c.handover_jumps.summary()
        within = c.within_changes.summary()
        ratio = None
        if handover["n"] and within["n"] and within["p99"] > 0:
            ratio = handover["p99"] / within["p99"]
        delay = self.delay.summary()
        period = self.config.control_period_s
        return {
            "steps": c.steps,
            "executed_actions": c.executed_actions,
            "stale_dropped": c.stale_dropped,
            "stale_executed": c.stale_executed,
            "empty_plan_ticks": c.empty_plan_ticks,
            "startup_ticks": c.startup_ticks,
            "paused_ticks": c.paused_ticks,
            "speed_scaling": self._speed,
            # How far plan time has fallen behind real time (slowed or paused), s.
            "plan_lag_s": (
                0.0
                if self.last_command_time is None
                else self.last_command_time - self.last_plan_time
            ),  # fmt: skip
            "chunks_accepted": c.chunks_accepted,
            "chunks_rejected": c.chunks_rejected,
            "requests_sent": c.requests_sent,
            "requests_timed_out": c.requests_timed_out,
            "requests_refused": c.requests_refused,
            "tracker_failures": self.tracker.failures,
            "resyncs": c.resyncs,
            "holding": self._holding,
            "remaining_steps": self.remaining_steps(),
            "delay_steps_p50": delay["p50"],
            "delay_steps_p95": delay["p95"],
            "delay_steps_max": delay["max"],
            "delay_ms_p50": None if delay["p50"] is None else delay["p50"] * period * 1e3,
            "delay_samples": delay["n"],
            "expected_delay_steps": self.delay.expected_steps(),
            "handover_jump_p99": handover["p99"],
            "handovers": handover["n"],
            "within_chunk_change_p99": within["p99"],
            "discontinuity_ratio": ratio,
            "last_rejection": c.last_rejection,
        }
