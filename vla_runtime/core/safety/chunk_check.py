"""Check an action chunk before it may execute: accept, clip or veto it (or call it stale).

The chunk follows the project convention (core/topics.py): `stamp` is the observation time,
`times[k]` when action k applies relative to it, `positions[k]` one value per joint name (the
arm joints plus, optionally, the gripper's finger joint in metres of one finger's opening).

Clipping never invents motion: it slows the chunk down (scales its time axis from now on, which
divides velocity by s, acceleration by s^2 and jerk by s^3), truncates it before
the first point that leaves the allowed space, or clamps the gripper into its range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from vla_runtime.core.gripper import max_opening
from vla_runtime.core.kinematics import DHChain
from vla_runtime.core.rates import MIN_POINT_SPACING_S
from vla_runtime.core.robot import RobotConfig
from vla_runtime.core.safety.command_geometry import ChainPoints, arm_and_hand_points
from vla_runtime.core.safety.workspace import Workcell

ACCEPT, CLIP, VETO, STALE = "accept", "clip", "veto", "stale"
DEPTH_TOLERANCE = 0.001  # m an arm below the table floor may sink while it leaves (noise)


@dataclass(frozen=True)
class ChunkCheckConfig:
    max_observation_age_s: float = 1.0  # s between the observation and the check
    max_future_s: float = 0.05  # s a stamp may lie ahead of now (clock skew) before it is vetoed
    max_state_age_s: float = 0.2  # s: an older joint state means the arm's position is unknown
    continuity_tolerance: float = 0.05  # rad on top of what max velocity allows until the start
    max_time_scale: float = 3.0  # slowing down more than this is a veto, not a clip
    # Chunks are slowed to this fraction of the joint velocity and acceleration limits: motion
    # planned at the limit trips the arm's reflexes on the first late or early command.
    limit_fraction: float = 0.7
    min_points: int = 2  # a truncated chunk must keep at least this many points
    max_points: int = 1000
    # A chunk whose first live action the arm cannot reach because the arm is behind it (it
    # held while the chunk was computed, or was slowed down) starts late instead of being
    # vetoed: its time axis is shifted so that the latest passed action the arm can start from
    # comes `retime_lead_s` s from now (a sync executor does this with every chunk).
    retime_behind: bool = True
    retime_lead_s: float = 0.02
    max_retime_s: float = 0.25  # s: a chunk that would start later than this is vetoed
    tcp_speed: float | None = None  # m/s; None: the robot's `tcp_speed`
    # Chunks are slowed to this fraction of the TCP speed limit: the speed checked is the chord
    # between chunk points, and the arm's path between them and its tracking run a little faster
    # (at 100 % the simulated arm reached 0.2505 m/s against 0.25).
    tcp_speed_fraction: float = 0.9
    workcell: Workcell = field(default_factory=Workcell)


@dataclass(frozen=True)
class Chunk:
    joint_names: tuple[str, ...]
    stamp: float
    times: tuple[float, ...]
    positions: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class Verdict:
    decision: str  # ACCEPT, CLIP, VETO or STALE
    reasons: tuple[str, ...] = ()
    numbers: dict = field(default_factory=dict)
    times: np.ndarray | None = None  # the chunk to execute (accept/clip), else None
    positions: np.ndarray | None = None
    stamp: float | None = None  # the stamp `times` count from (moved when re-timed)

    @property
    def executable(self) -> bool:
        return self.decision in (ACCEPT, CLIP)

    def vetoed(self, reason: str, **numbers) -> Verdict:
        return replace(
            self,
            decision=VETO,
            reasons=(*self.reasons, reason),
            numbers={**self.numbers, **numbers},
            times=None,
            positions=None,
        )

    def event(self) -> dict:
        return {"verdict": self.decision, "reasons": list(self.reasons), **self.numbers}


def _worst(ratios: dict) -> str:
    return max((k for k in ratios if k.endswith("_ratio")), key=ratios.get)


def _reject(decision: str, reason: str, **numbers) -> Verdict:
    return Verdict(decision, (reason,), numbers)


class ChunkChecker:
    def __init__(self, robot: RobotConfig, chain: DHChain, config: ChunkCheckConfig):
        if chain.dof != robot.dof:
            raise ValueError(f"kinematics {chain.name} has {chain.dof} joints, robot {robot.dof}")
        self.robot = robot
        self.chain = chain
        self.points = ChainPoints(chain)
        self.config = config
        margin = robot.position_margin
        self.lower = np.asarray(robot.position_min) + margin
        self.upper = np.asarray(robot.position_max) - margin
        for name in ("limit_fraction", "tcp_speed_fraction"):
            if not 0.0 < getattr(config, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(config, name)}")
        self.velocity = np.asarray(robot.velocity)
        self.acceleration = np.asarray(robot.acceleration)
        # What chunks are timed against (the continuity check uses the full velocity).
        self.planned_velocity = config.limit_fraction * self.velocity
        self.planned_acceleration = config.limit_fraction * self.acceleration
        self.jerk = np.asarray(robot.jerk)
        self.tcp_speed = config.tcp_speed if config.tcp_speed is not None else robot.tcp_speed
        self.gripper_joint = robot.gripper_joints[0] if robot.gripper_joints else None

    def check(
        self,
        chunk: Chunk,
        now: float,
        state_positions,
        state_stamp: float | None,
        state_table_depth: float | None = None,
    ) -> Verdict:
        """Judge `chunk` at time `now` given the arm positions measured at `state_stamp`;
        `state_table_depth`: how far the measured arm reaches below the table floor (m,
        `Workcell.table_depth`), None: from the measured positions."""
        cfg = self.config
        layout = self._layout(chunk)
        if isinstance(layout, Verdict):
            return layout
        arm_cols, gripper_col = layout
        try:
            times = np.asarray(chunk.times, dtype=float)
            positions = np.asarray(chunk.positions, dtype=float)
        except (TypeError, ValueError) as exc:
            return _reject(VETO, f"malformed chunk: {exc}")
        n = len(times)
        if n == 0 or positions.ndim != 2 or positions.shape != (n, len(chunk.joint_names)):
            return _reject(VETO, f"shape {positions.shape} for {n} points x "
                           f"{len(chunk.joint_names)} joints")  # fmt: skip
        if n > cfg.max_points:
            return _reject(VETO, f"{n} points > {cfg.max_points}", points=n)
        if not (np.isfinite(times).all() and np.isfinite(positions).all()):
            return _reject(VETO, "non-finite values")
        if not math.isfinite(chunk.stamp):
            return _reject(VETO, "non-finite stamp")
        if times[0] < 0.0 or (np.diff(times) < MIN_POINT_SPACING_S).any():
            return _reject(VETO, "time_from_start must be >= 0 and increase by at least "
                                 f"{MIN_POINT_SPACING_S * 1e3:g} ms a point")  # fmt: skip

        # Freshness: how old the observation is, and whether anything is still in the future.
        age = now - chunk.stamp
        if age < -cfg.max_future_s:
            return _reject(VETO, "stamp lies in the future", observation_age_s=age)
        if age > cfg.max_observation_age_s:
            return _reject(STALE, "observation too old", observation_age_s=age)
        live = np.nonzero(chunk.stamp + times >= now)[0]
        if len(live) == 0:
            return _reject(STALE, "every action is already past", observation_age_s=age)
        numbers = {"observation_age_s": age, "points": n}
        reasons: list[str] = []

        # Continuity with the measured state: the first action still to come must be reachable
        # at maximum velocity from where the arm was measured.
        if state_stamp is None or state_positions is None:
            return _reject(VETO, "joint state unknown", **numbers)
        state_age = now - state_stamp
        numbers["state_age_s"] = state_age
        if state_age > cfg.max_state_age_s:
            return _reject(VETO, "joint state too old", **numbers)
        arm = positions[:, arm_cols]
        state = np.asarray(state_positions, dtype=float)
        stamp, first = chunk.stamp, live[0]
        jump, allowed = self._gap(arm[first], state, stamp + times[first] - state_stamp)
        numbers["start_jump_rad"] = float(jump.max())
        if (jump > allowed).any() and cfg.retime_behind:
            late = self._behind(arm[:first], times[:first], state, stamp, now, state_stamp)
            if late is None:
                late = self._start_late(arm, times, state, stamp, now, state_stamp)
            if late is not None:
                first, shift = late
                stamp += shift
                jump, allowed = self._gap(arm[first], state, stamp + times[first] - state_stamp)
                numbers.update(retimed_s=shift, start_jump_rad=float(jump.max()))
                reasons.append(f"re-timed: the arm is behind the chunk, action {first} "
                               f"starts {shift:.3f} s late")  # fmt: skip
        if (jump > allowed).any():
            j = int(np.argmax(jump - allowed))
            return _reject(
                VETO,
                f"discontinuous start: {self.robot.joints[j]} {jump[j]:.3f} rad from the "
                f"measured state, allowed {allowed[j]:.3f}",
                **numbers,
            )
        # Space: joint limits (with margin) and Cartesian geometry; truncate before the first
        # offending point.
        bad = (arm < self.lower) | (arm > self.upper)
        first_bad = {}
        if bad.any():
            rows = np.nonzero(bad.any(axis=1))[0]
            j = int(np.nonzero(bad[rows[0]])[0][0])
            first_bad[f"joint limit {self.robot.joints[j]}"] = int(rows[0])
        frames, outline = self.points.frames(arm)  # (n, dof + 2, 3), (n, m, 3)
        arm_points, hand_points = arm_and_hand_points(frames)
        # An arm already below the table floor (a grasp that went down to the top) may stay as
        # deep or rise: refusing every chunk from there would leave it standing at the table.
        workcell = self.config.workcell
        if state_table_depth is None:
            state_frames, state_outline = self.points.frames(state[None])
            state_points = arm_and_hand_points(state_frames)[0]
            state_table_depth = float(workcell.table_depth(state_points, state_outline)[0])
        allowed = max(0.0, state_table_depth + DEPTH_TOLERANCE)
        for name, mask, worst in workcell.violations(arm_points, hand_points, outline, allowed):
            first_bad[name] = int(np.nonzero(mask)[0][0])
            numbers[f"{name} worst"] = worst
        keep = n
        if first_bad:
            keep = min(first_bad.values())
            culprit = min(first_bad, key=first_bad.get)
            numbers["first_violation_index"] = keep
            if keep < max(cfg.min_points, first + 1):
                return Verdict(VETO, (f"{culprit} at point {keep}",), numbers)
            reasons.append(f"truncated at point {keep}: {culprit}")
            times, positions, arm = times[:keep], positions[:keep], arm[:keep]
            frames = frames[:keep]

        # Derivatives by finite differences, and TCP speed, of the actions still to run (those
        # already past never run: a kink there must not slow the rest down); slow down if needed.
        scale, ratios = self._time_scale(times[first:], arm[first:], frames[first:, -1])
        numbers.update(ratios)
        if scale > cfg.max_time_scale:
            worst = _worst(ratios)
            return Verdict(
                VETO,
                (
                    *reasons,
                    f"too fast: needs {scale:.2f}x slower (> {cfg.max_time_scale}): {worst}",
                ),
                {**numbers, "time_scale": scale},
            )
        # Actions the arm has passed never run: those a re-timing put after now are dropped
        # (the arm would turn back for them), the others stay as past points to interpolate from.
        t_now = now - stamp
        keep = (np.arange(len(times)) >= first) | (times <= t_now)
        if not keep.all():
            first -= int(np.count_nonzero(~keep))
            times, positions, arm = times[keep], positions[keep], arm[keep]
        if first > 0 and times[first] > t_now:
            # The chunk stands between a passed action and the first live one at now: a knot
            # there (on its path: no new motion) anchors the stretch below at now, so the part
            # of that segment still to run is slowed like the rest. It is where what runs
            # starts: check it against the measured state; failing that, or too close to a
            # knot to add one, run only from the first live action (already found reachable).
            here = np.array([np.interp(t_now, times, arm[:, j]) for j in range(arm.shape[1])])
            jump, allowed = self._gap(here, state, now - state_stamp)
            spaced = times[first - 1] + MIN_POINT_SPACING_S <= t_now
            spaced &= t_now <= times[first] - MIN_POINT_SPACING_S
            if (jump > allowed).any() or (scale > 1.0 and not spaced):
                times, positions, first = times[first:], positions[first:], 0
            elif scale > 1.0 and times[first - 1] < t_now:
                row = np.array([np.interp(t_now, times, positions[:, j])
                                for j in range(positions.shape[1])])  # fmt: skip
                times = np.insert(times, first, t_now)
                positions = np.insert(positions, first, row, axis=0)
        if scale > 1.0:
            # Stretched from now: the past stays past (stretching from an earlier anchor would
            # bring passed actions back into the future); the rest runs slower from now on.
            times = np.where(times > t_now, t_now + (times - t_now) * scale, times)
            numbers["time_scale"] = scale
            reasons.append(f"slowed down {scale:.3f}x: " + _worst(ratios))

        if gripper_col is not None:
            width = positions[:, gripper_col]
            clamped = np.clip(width, 0.0, max_opening(self.robot))
            if (clamped != width).any():
                positions = positions.copy()
                positions[:, gripper_col] = clamped
                numbers["gripper_clamp_m"] = float(np.abs(clamped - width).max())
                reasons.append("gripper clamped into its range")
        decision = CLIP if reasons else ACCEPT
        return Verdict(decision, tuple(reasons), numbers, times, positions, stamp)

    def _gap(self, point, state, reach_time: float):
        """How far `point` is from the measured state, and how far the arm may have gone in
        `reach_time` (s) at maximum velocity, plus the tolerance."""
        allowed = self.config.continuity_tolerance + self.velocity * max(0.0, reach_time)
        return np.abs(point - state), allowed

    def _behind(self, passed, times, state, stamp, now, state_stamp):
        """(index, shift) of the latest already-passed action the arm can still start from
        when it is shifted to `retime_lead_s` s from now; None when none is near the arm."""
        start = now + self.config.retime_lead_s
        for k in range(len(passed) - 1, -1, -1):
            jump, allowed = self._gap(passed[k], state, start - state_stamp)
            if (jump <= allowed).all():
                return k, start - (stamp + times[k])
        return None

    def _start_late(self, arm, times, state, stamp, now, state_stamp):
        """(0, shift) that starts the chunk's first action once the arm can reach it at the
        planned velocity, when no action is near the arm because the chunk has moved on ahead
        of it along its own path (the arm held while the chunk was computed: its first actions
        move away from the state); None otherwise or beyond `max_retime_s` s."""
        cfg = self.config
        if len(arm) < 2:
            return None
        gap, step = arm[0] - state, arm[1] - arm[0]
        off = np.abs(gap) > cfg.continuity_tolerance
        if not np.all(gap[off] * step[off] > 0.0):  # the arm is beside or beyond the chunk
            return None
        need = float(np.max((np.abs(gap) - cfg.continuity_tolerance) / self.planned_velocity))
        start = max(now + cfg.retime_lead_s, state_stamp + need)
        shift = start - (stamp + times[0])
        return (0, shift) if 0.0 < shift <= cfg.max_retime_s else None

    def _layout(self, chunk: Chunk):
        """Column of each arm joint (robot order) and of the gripper, or a veto."""
        names = list(chunk.joint_names)
        if len(set(names)) != len(names):
            return _reject(VETO, f"duplicated joint names {names}")
        missing = [j for j in self.robot.joints if j not in names]
        allowed = set(self.robot.joints) | ({self.gripper_joint} if self.gripper_joint else set())
        unknown = [j for j in names if j not in allowed]
        if missing or unknown:
            return _reject(VETO, f"joint names {names}: missing {missing}, unknown {unknown}")
        gripper = names.index(self.gripper_joint) if self.gripper_joint in names else None
        return [names.index(j) for j in self.robot.joints], gripper

    def _time_scale(self, times, arm, tcp) -> tuple[float, dict]:
        """The slow-down factor that brings every finite-difference derivative and the TCP speed
        within limits, and each limit's worst ratio (1 = at the limit)."""
        ratios = {}
        if len(times) >= 2:
            dt = np.diff(times)
            velocity = np.diff(arm, axis=0) / dt[:, None]
            ratios["velocity_ratio"] = float((np.abs(velocity) / self.planned_velocity).max())
            if self.tcp_speed:
                speed = np.linalg.norm(np.diff(tcp, axis=0), axis=1) / dt
                planned = self.config.tcp_speed_fraction * self.tcp_speed
                ratios["tcp_speed_ratio"] = float(speed.max() / planned)
                ratios["tcp_speed_mps"] = float(speed.max())
        if len(times) >= 3:
            mid = 0.5 * (times[1:] + times[:-1])
            acceleration = np.diff(velocity, axis=0) / np.diff(mid)[:, None]
            ratios["acceleration_ratio"] = float(
                (np.abs(acceleration) / self.planned_acceleration).max()
            )
        if len(times) >= 4:
            jerk = np.diff(acceleration, axis=0) / np.diff(times[1:-1])[:, None]
            ratios["jerk_ratio"] = float((np.abs(jerk) / self.jerk).max())
        scale = max(
            1.0,
            ratios.get("velocity_ratio", 0.0),
            ratios.get("tcp_speed_ratio", 0.0),
            math.sqrt(ratios.get("acceleration_ratio", 0.0)),
            ratios.get("jerk_ratio", 0.0) ** (1.0 / 3.0),
        )
        return scale, ratios
