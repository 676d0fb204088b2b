"""Command gate at the control rate: the last filter between the streamer and the driver.

Commands only set a target. Every tick (fixed period T) the gate moves its output one step
toward the target under the robot's limits, so the output sequence itself obeys them, whatever
arrives: per step |v| <= v_max and |dv| <= a_max T (jerk too where it does not fight those),
velocity small enough to stop before the target and before the position limits (which carry the
configured margin), target clamped into those limits.

States: WAITING (nothing is sent until the joint state is known and a command agrees with it),
RUNNING, STOPPING (command timeout or lost joint state: decelerate at a_max to zero, then hold
the position), ESTOP (like STOPPING, and latched until reset()). After STOPPING or a reset the
gate re-arms the same way as at start-up, from where its output stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.rates import CONTROL_PERIOD_S
from vla_runtime.core.robot import RobotConfig

WAITING, RUNNING, STOPPING, ESTOP = "waiting", "running", "stopping", "estop"


@dataclass(frozen=True)
class GateConfig:
    control_period_s: float = CONTROL_PERIOD_S  # s between outputs (the control rate)
    command_timeout_s: float = 0.1  # s without a fresh command before the gate stops the arm
    start_tolerance: float = 0.05  # rad: an arming command must be this close to the state
    state_timeout_s: float = 0.5  # s without a joint state before the gate stops the arm
    max_command_lead_s: float = 0.25  # s a command's stamp may lie ahead of now
    gripper_deadband: float = 0.0005  # m of width change worth a gripper command
    event_interval_s: float = 1.0  # s between repeated events of one kind (counts accumulate)
    # s the clock may step back before the gate counts it as a jump (and restarts its watchdog).
    clock_jump_tolerance_s: float = 0.02
    # The output moves within this fraction of the joint velocity and acceleration limits:
    # the arm's controller interpolates each output over its own cycle and trips its reflex a
    # hair above the limit, so output at 100 % would trip it on the first uneven period.
    limit_fraction: float = 0.9


@dataclass
class GateOutput:
    arm: np.ndarray | None  # positions to send this tick (None: send nothing)
    gripper: float | None  # width in m to send this tick (None: unchanged)
    events: list[dict]


class CommandGate:
    def __init__(self, robot: RobotConfig, config: GateConfig = GateConfig()):
        self.robot = robot
        self.config = config
        margin = robot.position_margin
        self.hard_lower = np.asarray(robot.position_min, dtype=float)
        self.hard_upper = np.asarray(robot.position_max, dtype=float)
        self.lower = self.hard_lower + margin
        self.upper = self.hard_upper - margin
        if not 0.0 < config.limit_fraction <= 1.0:
            raise ValueError(f"limit_fraction must be in (0, 1], got {config.limit_fraction}")
        self.v_max = config.limit_fraction * np.asarray(robot.velocity, dtype=float)
        self.a_max = config.limit_fraction * np.asarray(robot.acceleration, dtype=float)
        self.j_max = np.asarray(robot.jerk, dtype=float)
        self.mode = WAITING
        self.output: np.ndarray | None = None  # last arm output and its per-tick derivatives
        self.velocity = np.zeros(robot.dof)
        self.acceleration = np.zeros(robot.dof)
        self.target: np.ndarray | None = None
        # The target's own velocity (from successive command stamps) lets the output follow a
        # moving target without lagging by the braking distance; it expires with the stream.
        self.target_velocity = np.zeros(robot.dof)
        self._target_velocity_until = -math.inf
        self._target_stamp: float | None = None
        self.gripper_target: float | None = None
        self.gripper_output: float | None = None
        self._gripper_sent: float | None = None
        self.state: np.ndarray | None = None
        self.state_stamp: float | None = None
        self.last_command_time: float | None = None  # receive time of the last fresh command
        self.stop_started: float | None = None
        self.latest_now = -math.inf  # the time of the previous tick()
        self._events: list[dict] = []
        self._throttle: dict[str, tuple[float, int]] = {}

    # -- inputs ------------------------------------------------------------------------------
    def update_state(self, positions, stamp: float) -> None:
        q = np.asarray(positions, dtype=float)
        if q.shape == (self.robot.dof,) and np.isfinite(q).all() and math.isfinite(stamp):
            self.state, self.state_stamp = q, stamp
        else:
            self._event("state_rejected", stamp, throttled=True, reason="malformed joint state")

    def command(self, arm, gripper_width: float | None, stamp: float, now: float) -> bool:
        """Take a setpoint (arm positions in robot joint order, gripper width in m or None)
        stamped for `stamp`, received at `now`. Returns whether it became the target."""
        cfg = self.config
        q = np.asarray(arm, dtype=float)
        reason = None
        if q.shape != (self.robot.dof,):
            reason = f"{q.size} arm values for {self.robot.dof} joints"
        elif not np.isfinite(q).all():
            reason = "non-finite arm values"
        elif gripper_width is not None and not math.isfinite(gripper_width):
            reason = "non-finite gripper width"
        elif not math.isfinite(stamp) or now - stamp > cfg.command_timeout_s:
            reason = f"stale command ({now - stamp:.3f} s old)"
        elif stamp - now > cfg.max_command_lead_s:
            reason = f"command stamped {stamp - now:.3f} s in the future"
        elif self.mode == ESTOP:
            reason = "e-stop latched"
        if reason is not None:
            self._event("command_rejected", now, throttled=True, reason=reason)
            return False
        clamped = np.clip(q, self.lower, self.upper)
        if (clamped != q).any():
            self._event(
                "command_clamped", now, throttled=True,
                excess_rad=float(np.abs(clamped - q).max()),
            )  # fmt: skip
        if self.mode != RUNNING and not self._arm(clamped, now):
            return False
        interval = stamp - self._target_stamp if self._target_stamp is not None else 0.0
        if self.target is not None and interval > 0.0:
            velocity = (clamped - self.target) / interval
            self.target_velocity = np.clip(velocity, -self.v_max, self.v_max)
            self._target_velocity_until = now + 1.5 * max(interval, cfg.control_period_s)
        else:
            self.target_velocity = np.zeros(self.robot.dof)
        self.target = clamped
        self._target_stamp = stamp
        if gripper_width is not None:
            self.gripper_target = min(max(gripper_width, 0.0), self.robot.gripper_max_width)
        self.last_command_time = now
        return True

    def estop(self, now: float) -> None:
        if self.mode != ESTOP:
            self._begin_stop(ESTOP, now, "estop")

    def reset(self, now: float) -> None:
        """Clear the e-stop latch; motion resumes only after a new arming command."""
        if self.mode == ESTOP:
            self.mode = STOPPING if self.moving else WAITING
            self._event("estop_reset", now)

    def new_episode(self, now: float) -> None:
        """The scene was reset (the arm moved by something else than this gate): forget the
        output and the target and re-arm from the measured state, as at start-up. An e-stop
        stays latched."""
        if self.mode != ESTOP:
            self.mode = WAITING
        self.output, self.target, self._target_stamp = None, None, None
        self.velocity[:] = 0.0
        self.acceleration[:] = 0.0
        self.target_velocity = np.zeros(self.robot.dof)
        self.state, self.state_stamp = None, None
        self._event("new_episode", now, mode=self.mode)

    @property
    def moving(self) -> bool:
        return bool(np.any(self.velocity != 0.0))

    # -- the control-rate step ---------------------------------------------------------------
    def tick(self, now: float) -> GateOutput:
        cfg = self.config
        if now < self.latest_now - cfg.clock_jump_tolerance_s:
            self._clock_jumped_back(now)
        self.latest_now = now
        if self.mode == RUNNING:
            if now - self.last_command_time > cfg.command_timeout_s:
                self._begin_stop(STOPPING, now, "command_timeout",
                                 silent_s=now - self.last_command_time)  # fmt: skip
            elif self.state_stamp is None or now - self.state_stamp > cfg.state_timeout_s:
                self._begin_stop(STOPPING, now, "state_lost")
        if self.output is None:
            return GateOutput(None, None, self._take_events())
        if self.mode == RUNNING:
            if now > self._target_velocity_until:
                self.target_velocity = np.zeros(self.robot.dof)
            self._step_toward(self.target)
        else:
            was_moving = self.moving
            self._step_toward(None)
            if was_moving and not self.moving:
                self._event(
                    "stopped", now, mode=self.mode,
                    decel_ms=1e3 * (now - self.stop_started),
                    stop_ms=1e3 * (now - (self.last_command_time or self.stop_started)),
                )  # fmt: skip
        return GateOutput(self.output.copy(), self._gripper_step(), self._take_events())

    # -- internals ---------------------------------------------------------------------------
    def _arm(self, command: np.ndarray, now: float) -> bool:
        """Start (or resume) following: the command must agree with where the arm is."""
        cfg = self.config
        if self.state is None or now - self.state_stamp > cfg.state_timeout_s:
            self._event("arm_rejected", now, throttled=True, reason="joint state unknown")
            return False
        reference = self.output if self.output is not None else self.state
        gap = float(np.abs(command - reference).max())
        if gap > cfg.start_tolerance:
            self._event(
                "arm_rejected", now, throttled=True,
                reason=f"command {gap:.3f} rad from the arm (> {cfg.start_tolerance})",
            )  # fmt: skip
            return False
        if self.output is None:
            self.output = np.clip(self.state, self.hard_lower, self.hard_upper)
            self.velocity[:] = 0.0
            self.acceleration[:] = 0.0
        self.mode = RUNNING
        self._event("armed", now, gap_rad=gap)
        return True

    def _clock_jumped_back(self, now: float) -> None:
        """A backward jump (sim reset, a bad /clock) puts every receive time seen so far in the
        future, which would blind the timeout watchdog: count the silence from now on."""
        self._event("clock_jump", now, throttled=True, jump_s=now - self.latest_now)
        if self.last_command_time is not None:
            self.last_command_time = min(self.last_command_time, now)
        if self._target_stamp is not None:
            self._target_stamp = min(self._target_stamp, now)
        self._target_velocity_until = min(self._target_velocity_until, now)

    def _begin_stop(self, mode: str, now: float, kind: str, **numbers) -> None:
        self.mode = mode
        self.target = None
        self._target_stamp = None
        self.stop_started = now
        speed = float(np.abs(self.velocity).max())
        self._event(kind, now, speed_rad_s=speed, **numbers)
        if self.output is not None and not self.moving:
            self._event("stopped", now, mode=mode, decel_ms=0.0,
                        stop_ms=1e3 * (now - (self.last_command_time or now)))  # fmt: skip

    def _step_toward(self, target: np.ndarray | None) -> None:
        """One output step: toward `target` or, with None, decelerate to rest."""
        T = self.config.control_period_s
        q, v, a = self.output, self.velocity, self.acceleration
        dv = self.a_max * T
        if target is None:
            wanted = np.sign(v) * np.maximum(np.abs(v) - dv, 0.0)
        else:
            # Close the gap this step, but only as fast relative to the target's own motion as
            # still lets the output stop on it.
            gap = target - q
            brake = _braking_speed(np.abs(gap), dv, T)
            vt = self.target_velocity
            wanted = np.clip(gap / T, vt - brake, vt + brake)
        # Never faster than the limits, nor than lets the joint stop before a position limit.
        # One step's worth of slack (a T^2) absorbs the rounding of the discrete braking rule.
        slack = dv * T
        up = np.minimum(self.v_max, _braking_speed(np.maximum(self.upper - q - slack, 0.0), dv, T))
        down = np.minimum(
            self.v_max, _braking_speed(np.maximum(q - self.lower - slack, 0.0), dv, T)
        )
        wanted = np.clip(wanted, -down, up)
        lo, hi = v - dv, v + dv
        # Jerk bounds the change of acceleration, unless that would break the bounds above.
        jlo, jhi = v + (a - self.j_max * T) * T, v + (a + self.j_max * T) * T
        lo_j, hi_j = np.maximum(lo, jlo), np.minimum(hi, jhi)
        fits = (
            (lo_j <= hi_j)
            & (np.clip(wanted, lo_j, hi_j) <= up)
            & (np.clip(wanted, lo_j, hi_j) >= -down)
        )
        lo, hi = np.where(fits, lo_j, lo), np.where(fits, hi_j, hi)
        new_v = np.clip(wanted, lo, hi)
        if target is None:  # stopping: never reverse
            new_v = np.where(np.sign(new_v) * np.sign(v) < 0.0, 0.0, new_v)
        new_q = np.clip(q + new_v * T, self.hard_lower, self.hard_upper)
        new_v = (new_q - q) / T
        self.acceleration = (new_v - v) / T
        self.velocity = np.where(np.abs(new_v) < 1e-12, 0.0, new_v)
        self.output = new_q

    def _gripper_step(self) -> float | None:
        if self.gripper_target is None:
            return None
        max_step = self.robot.gripper_max_speed * self.config.control_period_s
        current = self.gripper_output if self.gripper_output is not None else self.gripper_target
        if self.mode == RUNNING:
            current += min(max(self.gripper_target - current, -max_step), max_step)
        self.gripper_output = current
        sent = self._gripper_sent
        if (
            sent is None
            or abs(current - sent) >= self.config.gripper_deadband
            or (current == self.gripper_target and current != sent)
        ):
            self._gripper_sent = current
            return current
        return None

    def _event(self, kind: str, now: float, throttled: bool = False, **numbers) -> None:
        if throttled:
            last, count = self._throttle.get(kind, (-math.inf, 0))
            count += 1
            if now - last < self.config.event_interval_s:
                self._throttle[kind] = (last, count)
                return
            self._throttle[kind] = (now, 0)
            numbers["count"] = count
        self._events.append({"event": kind, "stamp": now, "mode": self.mode, **numbers})

    def _take_events(self) -> list[dict]:
        events, self._events = self._events, []
        return events


def _braking_speed(distance: np.ndarray, dv: np.ndarray, period: float) -> np.ndarray:
    """Largest speed from which decelerating by dv per step of `period` stops within
    `distance` (discrete: the distance covered is period * (v + (v - dv) + ...))."""
    half = 0.5 * dv
    return -half + np.sqrt(half * half + 2.0 * distance * dv / period)


class TickPacer:
    """Whether a control tick should produce an output: a starved process fires its missed
    timer periods back to back, and the gate steps one period per output, so outputs closer
    together (in wall time, when they reach the arm) than half a period would move the arm
    faster than the limits it enforces; those ticks are skipped (the arm lags instead).

    A simulation faster than real time ticks closer together in wall time on purpose: the
    spacing is divided by the tick clock's rate against wall time, measured over windows of
    `window_s`. The smaller of the last two windows counts, and never less than real time, so
    a starved process catching up on its clock (a slow window, then a fast one) keeps the
    real-time spacing."""

    def __init__(self, period: float, window_s: float = 0.5):
        self.period, self.window_s = period, window_s
        self.rate = 1.0  # tick-clock seconds per wall second that the spacing assumes
        self.skipped = 0
        self._last_wall = -math.inf
        self._anchor: tuple[float, float] | None = None
        self._previous_rate = 1.0

    def due(self, wall: float, clock: float) -> bool:
        if self._anchor is None:
            self._anchor = (wall, clock)
        elif wall - self._anchor[0] >= self.window_s:
            measured = (clock - self._anchor[1]) / (wall - self._anchor[0])
            self.rate = max(1.0, min(measured, self._previous_rate))
            self._previous_rate = measured
            self._anchor = (wall, clock)
        if wall - self._last_wall < 0.5 * self.period / self.rate:
            self.skipped += 1
            return False
        self._last_wall = wall
        return True
