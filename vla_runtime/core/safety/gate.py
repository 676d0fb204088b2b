"""Command gate at the control rate: the last filter between the streamer and the driver.

Commands only set a target. Every tick the gate moves its output one step toward the target under
the robot's limits, so the output sequence itself obeys them, whatever arrives: per output step |dq|
<= v_max(q) T and |dv| <= a_max T (T the period: each message is one period's motion, which a
trajectory controller runs over its own fixed time), and a tick that comes less than
`limit_fraction` T after the previous output sends nothing, so that the velocity also holds per
elapsed second where a controller applies each position as it arrives. Jerk too where it does not
fight those, velocity small enough to stop before the target and before the position limits (which
carry the configured margin), target clamped into those limits. v_max(q) is the manufacturer's
position-dependent limit where the robot description names a model
(core/safety/joint_velocity_limits.py), else its flat limit. With a `geometry`
(core/safety/command_geometry.py) each step is also held to the TCP speed limit and taken only if
the arm braking from it comes to rest clear of the workcell's violations.

States: WAITING (nothing is sent until the joint state is known and a command agrees with it),
RUNNING, STOPPING (command timeout or lost joint state: decelerate at a_max to zero, then hold
the position), ESTOP (a latch: an e-stop or a fault such as a driver's reflex, a rogue
publisher or the arm not following the output; like STOPPING, and commands are refused until
reset()). After STOPPING the gate re-arms the way it does at start-up, from where its output
stands; after reset() it forgets its output and re-arms from the measured state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.rates import CONTROL_PERIOD_S
from vla_runtime.core.robot import RobotConfig
from vla_runtime.core.safety.joint_velocity_limits import velocity_limits

WAITING, RUNNING, STOPPING, ESTOP = "waiting", "running", "stopping", "estop"
ESTOP_LATCH = "estop"  # `latched` after estop(); a fault latches under its own kind


@dataclass(frozen=True)
class GateConfig:
    control_period_s: float = CONTROL_PERIOD_S  # s between outputs (the control rate)
    # s without a fresh command before the gate stops the arm (MoveIt Servo's is 0.1 s): a
    # silence noticed at the first tick past it is reported within 100 ms.
    command_timeout_s: float = 0.09
    start_tolerance: float = 0.05  # rad: an arming command must be this close to the state
    # s without a joint state before the gate stops the arm: drivers publish at 100 Hz to 1 kHz,
    # so this is many lost states, and it keeps the stop inside the 100 ms a fault may take to
    # be noticed.
    state_timeout_s: float = 0.08
    # s a joint state's stamp may lie ahead of now (clock skew between driver and gate); one
    # further ahead is refused, or its age would read negative and blind the watchdog.
    max_state_lead_s: float = 0.05
    max_command_lead_s: float = 0.25  # s a command's stamp may lie ahead of now
    gripper_deadband: float = 0.0005  # m of width change worth a gripper command
    event_interval_s: float = 1.0  # s between repeated events of one kind (counts accumulate)
    # s the clock may step back before the gate counts it as a jump (and restarts its watchdog).
    clock_jump_tolerance_s: float = 0.02
    # The output moves within this fraction of the joint velocity and acceleration limits:
    # the arm's controller interpolates each output over its own cycle and trips its reflex a
    # hair above the limit, so output at 100 % would trip it on the first uneven period.
    limit_fraction: float = 0.9
    # Divergence: the measured position must lie within the range the output covered over the
    # last `divergence_window_s` before the state's stamp (the arm lags its output: franky-sim
    # at full speed tracks with a p99 error of ~0.3 rad, about 0.13 s of lag at 2.36 rad/s, so
    # the window allows twice that), widened by `divergence_margin` rad (overshoot and noise
    # when stopping). It latches the fault after `divergence_states` consecutive states beyond
    # that, spanning at least `divergence_persist_s` (one noisy sample is no divergence).
    divergence_window_s: float = 0.3
    divergence_margin: float = 0.1
    divergence_states: int = 3
    divergence_persist_s: float = 0.02
    geometry_samples: int = 4  # points along the braking path checked against the geometry


@dataclass
class GateOutput:
    arm: np.ndarray | None  # positions to send this tick (None: send nothing)
    gripper: float | None  # width in m to send this tick (None: unchanged)
    events: list[dict]


class CommandGate:
    def __init__(
        self,
        robot: RobotConfig,
        config: GateConfig = GateConfig(),
        geometry=None,
        latched: str | None = None,
    ):
        """`geometry`: None or an object with position_violation(q) -> str | None,
        position_violations(qs (n, dof)) -> list[str | None], tcp_speed(q_from, q_to, dt) -> m/s
        and tcp_speed_limit (m/s or None). `latched`: start latched under that kind (a latch
        that outlived a restart of the node)."""
        self.robot = robot
        self.config = config
        self.geometry = geometry
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
        self.velocity_model = robot.velocity_limits
        self.mode = WAITING
        self.output: np.ndarray | None = None  # last arm output and its derivatives (per s)
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
        self._state_received = -math.inf  # gate time at which the state arrived
        self.last_command_time: float | None = None  # receive time of the last fresh command
        self.stop_started: float | None = None
        self.latest_now = -math.inf  # the time of the previous tick()
        self._output_time: float | None = None  # gate time of the last output sent
        self._latch: str | None = None
        self._forget_at_rest = False  # reset() while braking: forget the output at rest
        # Outputs sent over the divergence window (ring buffer) and the run of diverged states.
        size = int(math.ceil((config.divergence_window_s + 0.5) / config.control_period_s)) + 2
        self._history_t = np.full(size, -math.inf)
        self._history_q = np.zeros((size, robot.dof))
        self._history_next = 0
        self._diverged: tuple[int, float] = (0, math.nan)  # consecutive count, first stamp
        self._divergence_since = -math.inf  # the first diverged state of a latched divergence
        self._events: list[dict] = []
        self._throttle: dict[str, tuple[float, int]] = {}
        if latched is not None:
            self._latch, self.mode = str(latched), ESTOP

    # -- inputs ------------------------------------------------------------------------------
    def update_state(self, positions, stamp: float, now: float | None = None) -> None:
        """A measured joint state stamped `stamp`, received at `now` (None: the latest tick)."""
        q = np.asarray(positions, dtype=float)
        if not (q.shape == (self.robot.dof,) and np.isfinite(q).all() and math.isfinite(stamp)):
            self._event("state_rejected", stamp if now is None else now, throttled=True,
                        reason="malformed joint state")  # fmt: skip
            return
        received = now if now is not None else self.latest_now
        if not math.isfinite(received):
            received = stamp  # before the first tick: nothing to compare with yet
        lead = stamp - received
        if lead > self.config.max_state_lead_s:
            self._event("state_rejected", received, throttled=True, lead_s=lead,
                        reason=f"joint state stamped {lead:.3f} s in the future")  # fmt: skip
            return
        self.state, self.state_stamp, self._state_received = q, stamp, received
        if self.mode == RUNNING:
            self._check_divergence(q, stamp, received)

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
        elif self._latch is not None:
            reason = f"{_latch_name(self._latch)} latched"
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

    def estop(self, now: float, latched: bool = True) -> None:
        """Stop: decelerate to rest and hold. Latched (the default) until reset(); unlatched,
        a command that agrees with the held output re-arms, as after a command timeout."""
        if self._latch is not None:
            return
        if latched:
            self._latch = ESTOP_LATCH
            self._begin_stop(ESTOP, now, "estop")
        elif self.mode == RUNNING:
            self._begin_stop(STOPPING, now, "stop_requested")

    def fault(self, now: float, kind: str, **numbers) -> None:
        """Latch a fault of `kind` (a driver's reflex or protective stop, a rogue publisher, the
        arm not following): like an e-stop, and commands are refused naming it."""
        if self._latch is not None:
            self._event("fault", now, throttled=True, fault=kind, already=self._latch, **numbers)
            return
        self._latch = kind
        self._begin_stop(ESTOP, now, "fault", fault=kind, **numbers)

    def restore_latch(self, kind: str, now: float) -> None:
        """Start latched under `kind`: a latch that outlived a restart of the node. The output
        is unknown, so nothing is sent until reset() and an arming command."""
        self._latch = str(kind)
        self.mode = ESTOP
        self._forget_motion()
        self._event("latch_restored", now, latched=self._latch)

    @property
    def latched(self) -> str | None:
        """What holds the gate: "estop", a fault's kind, or None."""
        return self._latch

    def reset(self, now: float) -> bool:
        """Clear the latch (an e-stop or a fault). The gate forgets its output, target and
        velocities and re-arms from the measured state, as at start-up: the next command must
        agree with where the arm is, not with where the gate last sent it. If the output is
        still braking, it comes to rest first. Returns whether a latch was cleared."""
        if self._latch is None:
            return False
        kind, self._latch = self._latch, None
        if self.moving:
            self.mode = STOPPING
            self._forget_at_rest = True
        else:
            self.mode = WAITING
            self._forget_motion()
        self._event("estop_reset", now, latched=kind)
        return True

    def new_episode(self, now: float, start: float | None = None) -> None:
        """The scene was reset (the arm moved by something else than this gate): forget the
        output and the target and re-arm from the measured state, as at start-up. A latch
        holds, except a divergence that began with a state stamped at or after `start` (given
        when the reset itself moved the arm): the gate saw the reset's move before the
        announcement of the episode, not an arm that failed to follow."""
        since = self._divergence_since
        if self._latch == "divergence" and start is not None and since >= start:
            self._latch = None
            self._event("divergence_cleared", now, since=since, start=start,
                        reason="the scene reset moved the arm")  # fmt: skip
        if self._latch is None:
            self.mode = WAITING
        self._forget_motion()
        self.state, self.state_stamp = None, None
        self._event("new_episode", now, mode=self.mode)

    @property
    def moving(self) -> bool:
        return bool(np.any(self.velocity != 0.0))

    # -- the control-rate step ---------------------------------------------------------------
    def tick(self, now: float) -> GateOutput:
        cfg = self.config
        T = cfg.control_period_s
        if now < self.latest_now - cfg.clock_jump_tolerance_s:
            self._clock_jumped_back(now)
        self.latest_now = now
        if self.mode == RUNNING:
            if now - self.last_command_time > cfg.command_timeout_s:
                self._begin_stop(STOPPING, now, "command_timeout",
                                 silent_s=now - self.last_command_time)  # fmt: skip
            elif not self._state_fresh(now):
                self._begin_stop(STOPPING, now, "state_lost", **self._state_ages(now))
        if self.output is None:
            return GateOutput(None, None, self._take_events())
        dt = T
        # A full step sooner than limit_fraction T after the previous one would exceed the
        # velocity limit per elapsed second: such a tick sends nothing (the arm lags instead).
        soonest = cfg.limit_fraction * T * (1.0 - 1e-6)  # less float rounding of tick times
        if self._output_time is not None and now - self._output_time < soonest:
            self._event("tick_too_early", now, throttled=True, elapsed_s=now - self._output_time)
            return GateOutput(None, None, self._take_events())
        if self.mode == RUNNING:
            if now > self._target_velocity_until:
                self.target_velocity = np.zeros(self.robot.dof)
            self._step_toward(self.target, dt, now)
        else:
            was_moving = self.moving
            self._step_toward(None, dt, now)
            if was_moving and not self.moving:
                self._event(
                    "stopped", now, mode=self.mode,
                    decel_ms=1e3 * (now - self.stop_started),
                    stop_ms=1e3 * (now - (self.last_command_time or self.stop_started)),
                )  # fmt: skip
        arm = self.output.copy()
        self._output_time = now
        self._remember_output(now, arm)
        gripper = self._gripper_step(dt)
        if self._forget_at_rest and not self.moving:  # reset() while braking: now at rest
            self._forget_motion()
            if self.mode == STOPPING:
                self.mode = WAITING
        return GateOutput(arm, gripper, self._take_events())

    # -- internals ---------------------------------------------------------------------------
    def _state_fresh(self, now: float) -> bool:
        """Whether the joint state is known and recent: neither stamped too long ago, nor too
        far ahead, nor received too long ago (the gate's own clock: no stamp can blind it)."""
        if self.state_stamp is None:
            return False
        cfg = self.config
        age = now - self.state_stamp
        return (
            -cfg.max_state_lead_s <= age <= cfg.state_timeout_s
            and now - self._state_received <= cfg.state_timeout_s
        )

    def _state_ages(self, now: float) -> dict:
        if self.state_stamp is None:
            return {}
        return {"state_age_s": now - self.state_stamp,
                "received_s_ago": now - self._state_received}  # fmt: skip

    def _arm(self, command: np.ndarray, now: float) -> bool:
        """Start (or resume) following: the command must agree with where the arm is."""
        cfg = self.config
        if self._forget_at_rest:
            self._event("arm_rejected", now, throttled=True, reason="still braking after reset")
            return False
        if self.state is None or not self._state_fresh(now):
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
            self._remember_output(now, self.output)
        self.mode = RUNNING
        self._diverged = (0, math.nan)
        self._event("armed", now, gap_rad=gap)
        return True

    def _forget_motion(self) -> None:
        """Drop output, target and derivatives: the next arming starts from the measured state."""
        self.output, self.target, self._target_stamp = None, None, None
        self.velocity = np.zeros(self.robot.dof)
        self.acceleration = np.zeros(self.robot.dof)
        self.target_velocity = np.zeros(self.robot.dof)
        self._target_velocity_until = -math.inf
        self.gripper_target = self.gripper_output  # hold the gripper where it stands
        self._output_time = None
        self._forget_at_rest = False
        self._history_t[:] = -math.inf
        self._diverged = (0, math.nan)
        self._divergence_since = -math.inf

    def _clock_jumped_back(self, now: float) -> None:
        """A backward jump (sim reset, a bad /clock) puts every receive time seen so far in the
        future, which would blind the timeout watchdog: count the silence from now on."""
        self._event("clock_jump", now, throttled=True, jump_s=now - self.latest_now)
        if self.last_command_time is not None:
            self.last_command_time = min(self.last_command_time, now)
        if self._target_stamp is not None:
            self._target_stamp = min(self._target_stamp, now)
        self._target_velocity_until = min(self._target_velocity_until, now)
        self._state_received = min(self._state_received, now)
        if self._output_time is not None:  # one ordinary step follows
            self._output_time = now - self.config.control_period_s
        self._history_t = np.minimum(self._history_t, now)

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

    def _velocity_bounds(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(down, up) >= 0: how fast each joint may move down and up at positions q."""
        if self.velocity_model is None:
            return self.v_max, self.v_max
        lower, upper = velocity_limits(self.velocity_model, q)
        fraction = self.config.limit_fraction
        return np.minimum(self.v_max, -fraction * lower), np.minimum(self.v_max, fraction * upper)

    def _step_toward(self, target: np.ndarray | None, dt: float, now: float) -> None:
        """One output step over `dt` s: toward `target` or, with None, decelerate to rest."""
        T = self.config.control_period_s
        q, v, a = self.output, self.velocity, self.acceleration
        dv = self.a_max * dt  # the velocity change this step may make
        # Braking rules assume full periods ahead: shorter ones brake over less distance.
        dv_period = self.a_max * T
        braking = np.sign(v) * np.maximum(np.abs(v) - dv, 0.0)
        if target is None:
            wanted = braking
        else:
            # Close the gap this step, but only as fast relative to the target's own motion as
            # still lets the output stop on it.
            gap = target - q
            brake = _braking_speed(np.abs(gap), dv_period, T)
            vt = self.target_velocity
            wanted = np.clip(gap / dt, vt - brake, vt + brake)
        # Never faster than the limits, nor than lets the joint stop before a position limit.
        # One step's worth of slack (a T^2) absorbs the rounding of the discrete braking rule.
        slack = dv_period * T
        v_down, v_up = self._velocity_bounds(q)
        up = np.minimum(v_up, _braking_speed(np.maximum(self.upper - q - slack, 0.0), dv_period, T))
        down = np.minimum(
            v_down, _braking_speed(np.maximum(q - self.lower - slack, 0.0), dv_period, T)
        )
        wanted = np.clip(wanted, -down, up)
        lo, hi = v - dv, v + dv
        # Jerk bounds the change of acceleration, unless that would break the bounds above.
        jlo, jhi = v + (a - self.j_max * dt) * dt, v + (a + self.j_max * dt) * dt
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
        elif self.geometry is not None:
            new_v = self._geometry_step(q, v, new_v, braking, target, dt, now)
        new_q = np.clip(q + new_v * dt, self.hard_lower, self.hard_upper)
        new_v = (new_q - q) / dt
        self.acceleration = (new_v - v) / dt
        self.velocity = np.where(np.abs(new_v) < 1e-12, 0.0, new_v)
        self.output = new_q

    def _geometry_step(self, q, v, new_v, braking, target, dt: float, now: float) -> np.ndarray:
        """The candidate velocity `new_v`, slowed to the TCP speed limit, or the braking step
        when the arm braking from the candidate would not come to rest clear of the workcell's
        violations. An output already in violation (the arm started there) may move only
        toward a clear target and into no other kind of violation than the one it is in."""
        geometry = self.geometry
        dv = self.a_max * dt
        limit = geometry.tcp_speed_limit
        if limit and np.any(new_v != 0.0):
            speed = geometry.tcp_speed(q, q + new_v * dt, dt)
            if speed > limit:
                # The TCP moves about linearly with a step this small; the acceleration limits
                # still bound the change (they hold the arm's reflexes off).
                new_v = np.clip(new_v * (limit / speed), v - dv, v + dv)
                self._event("tcp_speed_limited", now, throttled=True, speed_mps=speed,
                            limit_mps=limit)  # fmt: skip
        candidate = q + new_v * dt
        rows = np.vstack([q, target, candidate, self._rest_path(candidate, new_v)])
        here, goal, *path = geometry.position_violations(rows)
        found = [reason for reason in path if reason is not None]
        if here is None:
            safe = not found
        else:
            kind = _violation_kind(here)
            safe = goal is None and all(_violation_kind(r) == kind for r in found)
        if safe:
            return new_v
        self._event("geometry_hold", now, throttled=True,
                    reason=found[0] if found else f"{here}; target {goal}")  # fmt: skip
        return braking

    def _rest_path(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Points along the path of each joint braking from (q, v) at a_max until rest, the
        rest point last (continuous braking: the discrete steps stop a little shorter)."""
        stop_after = np.abs(v) / self.a_max
        n = self.config.geometry_samples
        times = np.max(stop_after) * np.arange(1, n + 1)[:, None] / n
        t = np.minimum(times, stop_after)
        return q + v * t - 0.5 * np.sign(v) * self.a_max * t * t

    def _remember_output(self, now: float, q: np.ndarray) -> None:
        k = self._history_next
        self._history_t[k], self._history_q[k] = now, q
        self._history_next = (k + 1) % len(self._history_t)

    def _check_divergence(self, q: np.ndarray, stamp: float, now: float) -> None:
        """Latch "divergence" when the measured position has left the range the output covered
        around the state's stamp (see GateConfig) for a few states in a row."""
        cfg = self.config
        recent = self._history_t >= stamp - cfg.divergence_window_s
        if not recent.any():  # the output has not changed since: the arm must be at the last
            recent = self._history_t == self._history_t.max()
        if not np.isfinite(self._history_t[recent]).any():
            return
        outputs = self._history_q[recent]
        excess = np.maximum(outputs.min(axis=0) - q, q - outputs.max(axis=0))
        joint = int(np.argmax(excess))
        if excess[joint] <= cfg.divergence_margin:
            self._diverged = (0, math.nan)
            return
        count, since = self._diverged
        count, since = count + 1, (stamp if count == 0 else since)
        self._diverged = (count, since)
        if count >= cfg.divergence_states and stamp - since >= cfg.divergence_persist_s:
            if self._latch is None:
                self._divergence_since = since
            self.fault(now, "divergence", joint=self.robot.joints[joint],
                       error_rad=float(excess[joint] + cfg.divergence_margin),
                       beyond_margin_rad=float(excess[joint]), states=count,
                       window_s=cfg.divergence_window_s)  # fmt: skip

    def _gripper_step(self, dt: float) -> float | None:
        if self.gripper_target is None:
            return None
        max_step = self.robot.gripper_max_speed * dt
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


def _latch_name(kind: str) -> str:
    return "e-stop" if kind == ESTOP_LATCH else f"fault {kind!r}"


def _violation_kind(reason: str) -> str:
    """What a geometry violation is about, without its numbers ("table: 0.020 m below")."""
    return reason.split(":", 1)[0]


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
