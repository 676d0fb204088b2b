"""Latency-aware streaming of action chunks (docs/design.md §4), pure logic without ROS.

Time model: all times are seconds on one clock (ROS time). A command produced at control time
`now` takes effect at the command time t_c = now + driver_delay. An action of a chunk computed
from the observation at t_obs is meant for T_k = t_obs + time_from_start_k; it is stale when
T_k < t_c: it can no longer be applied on time, so the stale prefix is dropped and counted.

The plan (plan.py) is a C1 cubic Hermite spline through timed knots (positions + velocities):
the chunk's actions with finite-difference velocities, plus an anchor knot at the hand-over. A
merge (handover.py) keeps the old plan up to the first usable new action and blends old into
new over the overlap (at most `blend_window_s`). Each control tick samples the plan at t_c and
a jerk-limited tracker (ruckig) turns it into the command; when the plan has run dry the
tracker brakes to a stop within the limits (never extrapolates).

Watchdogs (`events()` reports each once, as a dict for the safety events topic): an answer
overdue by the engine's usual latency (requests.py) halts the plan (the rest of it was made for
a world the policy no longer reports on: the command brakes now) and asks again at once; a plan
that runs dry while the command moves is reported; `halt(reason)` does the same for the node's
own watchdogs (frozen cameras, silent joint states).

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
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.interpolation import JerkLimitedTracker, Limits, MotionState
from vla_runtime.core.rates import MIN_POINT_SPACING_S
from vla_runtime.core.speed_scaling import PlanClock
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.handover import blend, splice
from vla_runtime.core.streaming.metrics import Counters
from vla_runtime.core.streaming.plan import EPS, Plan, finite_difference_velocities
from vla_runtime.core.streaming.requests import RequestTracker

# The most control periods one tick advances the command by. After the process stalled for
# longer, the command goes on from where it stopped and rejoins the plan within the limits over
# the next ticks, instead of jumping ahead by the whole stall in a single command.
MAX_TICK_PERIODS = 10


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
    retry: int = 0  # answers refused in a row before it: the engine should sample afresh


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


class ActionStreamer:
    """Plan, merge, request policy, hold and counters for one arm (+ gripper column).

    Call `tick(now)` once per control period, `merge_chunk(...)` when a chunk arrives and
    `want_request(now)` / `make_request(now)` to drive inference requests; metrics.py reports
    its figures.
    """

    def __init__(self, config: StreamerConfig, limits: Limits, initial_position, arm_dof=None):
        self.config = config
        self.tracker = JerkLimitedTracker(limits)
        self.requests = RequestTracker(config.warmup_requests, config.request_timeout_s)
        self.state = MotionState.at_rest(initial_position)
        if self.state.position.shape != (limits.dof,):
            raise ValueError(f"initial position has {self.state.position.shape}, "
                             f"limits {limits.dof} joints")  # fmt: skip
        self.dof = limits.dof
        self.arm_dof = self.dof if arm_dof is None else arm_dof
        self.plan: Plan | None = None
        self.counters = Counters()
        self.clock = PlanClock()
        self._speed = 1.0  # latest speed fraction; the clock takes it at the next tick
        self.last_command_time: float | None = None
        self.last_plan_time: float | None = None  # plan time at last_command_time
        self._handover: _Handover | None = None
        self._holding = True
        self.halted: str | None = None  # why the plan was dropped (until the next chunk)
        self._events: list[dict] = []

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

    @property
    def holding(self) -> bool:
        """Whether the command holds (no plan to follow, or it ran dry)."""
        return self._holding

    def tick(self, now: float) -> Setpoint:
        """Advance the command to the command time now + driver_delay."""
        c = self.counters
        period = self.config.control_period_s
        t_c = now + self.config.driver_delay_s
        previous = self.last_command_time
        if previous is not None and t_c <= previous:  # clock did not advance (or went back)
            return self._setpoint(previous)
        dt = period if previous is None else min(t_c - previous, MAX_TICK_PERIODS * period)
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
            reference = self._gripper_later(reference)
            self.state = self.tracker.track(self.state, reference, t_c - dt, dt, t_end)
            self._holding = False
        else:
            if plan is not None:
                self._count_executed(plan, tau_previous, tau_c)
                if scale > 0.0:  # a paused plan is not a starved one
                    c.empty_plan_ticks += 1
            elif self.halted is not None:
                c.halted_ticks += 1
            else:
                c.startup_ticks += 1
            ran_dry = plan is not None and not self._holding and scale > 0.0
            if ran_dry and self.config.mode == "async":  # sync plans run dry by design
                self._events.append({"event": "plan_exhausted", "stamp": now,
                                     "speed_rad_s": _speed(self.state)})  # fmt: skip
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

    def _gripper_later(self, reference):
        """`reference` with the gripper columns taken `arm_only_delay_s` earlier in the plan:
        a command reaches the gripper that much sooner than the arm, and the two must reach
        the plan together, as in the data the policy learnt from."""
        lag, n = self.config.arm_only_delay_s, self.arm_dof
        if lag == 0.0 or n == self.dof:
            return reference

        def sample(t):
            p, v, a = reference(t)
            gp, gv, ga = reference(t - lag)
            return (np.concatenate([p[:n], gp[n:]]), np.concatenate([v[:n], gv[n:]]),
                    np.concatenate([a[:n], ga[n:]]))  # fmt: skip

        return sample

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

    def halt(self, now: float, reason: str, **numbers) -> None:
        """Drop the plan: the command brakes to rest within the limits from the next tick on,
        until a chunk arrives. Reported once per halt."""
        self.plan = None
        self._close_handover()
        self.halted = reason
        self.counters.halts += 1
        self._events.append({"event": "halt", "stamp": now, "reason": reason,
                             "speed_rad_s": _speed(self.state), **numbers})  # fmt: skip

    def check_overdue(self, now: float) -> bool:
        """Halt and give the request up when its answer is overdue (requests.py)."""
        overdue = self.requests.expire(now)
        if overdue is None:
            return False
        self.halt(now, "chunk_overdue", request=overdue.request_id, stage=overdue.stage,
                  waited_ms=1e3 * overdue.waited_s,
                  expected_ms=1e3 * overdue.expected_s)  # fmt: skip
        return True

    def engine_failed(self, now: float, request_id: int | None, reason: str, **numbers) -> bool:
        """The engine reports its attempt at the pending request failed or hangs: halt and ask
        again at once (False: not the pending request, nothing done)."""
        if not self.requests.engine_failed(request_id):
            return False
        self.halt(now, reason, request=request_id, **numbers)
        return True

    def events(self) -> list[dict]:
        """The watchdogs' reports since the last call."""
        events, self._events = self._events, []
        return events

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
        delay_steps = self.requests.answered(request_id, self.counters.steps, now)
        result = self._merge(now, t_obs, times_from_start, positions)
        result.delay_steps = delay_steps
        if result.accepted:
            self.counters.chunks_accepted += 1
            self.halted = None
        else:
            self.reject_chunk(result.reason)
        return result

    def reject_chunk(self, reason: str) -> None:
        """Count a chunk that cannot be used, here or before it reached the streamer."""
        self.counters.chunks_rejected += 1
        self.counters.last_rejection = reason

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
        if np.any(tfs < 0) or np.any(np.diff(tfs) < MIN_POINT_SPACING_S):
            return MergeResult(False, "time_from_start must be >= 0 and increase by at least "
                                      f"{MIN_POINT_SPACING_S * 1e3:g} ms a point")  # fmt: skip
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
        held = self.state.position
        window = blend(self.plan, held, t_c, times, positions, velocities, cfg.blend_window_s,
                       self.tracker.limits.acceleration)  # fmt: skip
        self.plan = splice(self.plan, held, t_c, times, positions, velocities)
        self._close_handover()
        self._handover = _Handover(
            until=times[0] + window, measured=self.counters.chunks_accepted > 0
        )
        return MergeResult(True, stale_dropped=first, blend_window_s=window)

    # ------------------------------------------------------------------ requests

    def remaining_steps(self) -> int:
        """Whole control steps of plan left after the last command time."""
        if self.plan is None or self.last_plan_time is None:
            return 0
        left = self.plan.end_time - self.last_plan_time
        return max(0, int(math.floor(left / self.config.control_period_s + EPS)))

    def want_request(self, now: float) -> bool:
        cfg = self.config
        if self.requests.awaiting(now):
            return False
        remaining = self.remaining_steps()
        if cfg.mode == "sync":
            return remaining == 0
        scale = self._speed
        if scale == 0.0:  # paused: the plan does not shrink, nothing to plan ahead for
            return False
        if cfg.request_policy == "continuous":
            return True
        # At speed s the remaining plan lasts remaining / s control steps.
        return remaining < scale * (self.requests.delay.expected_steps() + cfg.margin_steps)

    def request_refused(self, request_id: int) -> bool:
        """The chunk answering `request_id` will not come (the safety node vetoed it): the next
        request may go out at once instead of after `request_timeout_s` of a starving plan.
        Returns whether it was the pending request."""
        return self.requests.refuse(request_id)

    def make_request(self, now: float) -> Request:
        """Register a request going out now; carries the actions not yet executed."""
        request_id = self.requests.send(now, self.counters.steps)
        plan = self.plan
        if plan is None or self.last_plan_time is None:
            times, positions = np.empty(0), np.empty((0, self.dof))
        else:
            # Plan time relative to the plan time at `now` (= now - stamp while s is 1).
            left = plan.is_action & (plan.times > self.last_plan_time)
            times, positions = plan.times[left] - self.clock.at(now), plan.positions[left]
        return Request(request_id, now, times, positions, self.requests.refused_in_a_row)

    @property
    def pending_request(self) -> int | None:
        return self.requests.pending


def _speed(state: MotionState) -> float:
    return float(np.max(np.abs(state.velocity), initial=0.0))


def chunk_in_joint_order(chunk, arm_joints, joint_names, held_gripper: float):
    """(times_from_start, positions in `joint_names` order) of a chunk (core Chunk), or the
    reason it cannot be used. The gripper column is optional: without it the gripper keeps
    `held_gripper`, its current command."""
    names = list(chunk.joint_names)
    if len(set(names)) != len(names):
        return f"duplicated joint names {names}"
    missing = [j for j in arm_joints if j not in names]
    unknown = [n for n in names if n not in joint_names]
    if missing or unknown:
        return f"joint names {names}: missing {missing}, unknown {unknown}"
    columns = [names.index(j) if j in names else None for j in joint_names]
    rows = []
    for k, point in enumerate(chunk.positions):
        if len(point) != len(names):
            return f"point {k}: {len(point)} positions for {len(names)} joints"
        rows.append([point[c] if c is not None else held_gripper for c in columns])
    times = np.array(chunk.times)
    return times, np.array(rows, dtype=float).reshape(len(rows), len(columns))
