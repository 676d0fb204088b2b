"""Phase-adaptive compute scheduling (docs/design.md §5): signals -> the compute mode of the next
inference. Pure logic, no ROS imports; `nodes/scheduler.py` feeds it.

Four tiers, cheapest last, each mapped to a compute mode by `SchedulerConfig.tiers`:

| tier | default | recomputed | reused |
|---|---|---|---|
| FULL | v1d0 | every observation block, full denoising | instruction KV (exact) |
| PARTIAL | v2d1 | changed cameras, state; half the steps | KV of stable cameras |
| REUSE | v3d2 | state token; warm-started denoising | KV of every camera |
| FROZEN | v4d2 | nothing; warm-started denoising | the whole prefix (arm at rest) |

Per inference the cues say which tier the situation needs (`TierPolicy.decide`):
- forced FULL, no hysteresis: new episode/instruction, the first `start_full_s` of an episode, a
  gripper transition (commanded, measured or planned in the newest chunk), a safety clip or
  veto since the last inference, and the refresh bound (at least one full refresh in any
  `refresh_every` consecutive inferences);
- FULL: the engine's chunk divergence or vision dissimilarity, a camera's image change, or the
  joint travel since the last full refresh above its `*_full` threshold;
- PARTIAL: divergence above `divergence_partial`, joint acceleration above
  `acceleration_partial`, or some camera above its stable threshold;
- REUSE at most while the arm moves (joint speed above `static_joint_speed`).

Hysteresis, two ways: a cue's threshold is lowered by `exit_ratio` while the scheduler is at or
above the cue's tier (Schmitt trigger: no flapping around a threshold), and a cheaper tier is
taken only once `hold_inferences` consecutive demands allow it (more compute: at once).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import yaml

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.scene_change import SceneChange

FULL, PARTIAL, REUSE, FROZEN = 0, 1, 2, 3
TIER_NAMES = ("full", "partial", "reuse", "frozen")
# Numbers of a clip verdict that changed the arm's motion: the chunk was slowed down or cut
# short. A clip that only re-timed a late chunk or clamped the gripper into its range leaves
# the motion as the policy planned it.
MOTION_CLIPS = ("time_scale", "first_violation_index")


def is_intervention(event: Mapping) -> bool:
    """A safety verdict after which the next inference runs full: a veto, or a clip that
    changed the arm's motion (the policy's plan disagreed with what the arm may do)."""
    verdict = event.get("verdict")
    return verdict == "veto" or (verdict == "clip" and any(k in event for k in MOTION_CLIPS))


@dataclass(frozen=True)
class SchedulerConfig:
    """Thresholds (config/scheduler.yaml; `vla-runtime calibrate scheduler` fits them)."""

    tiers: tuple[str, ...] = ("v1d0", "v2d1", "v3d2", "v4d2")  # FULL, PARTIAL, REUSE, FROZEN
    refresh_every: int = 5  # K: a full refresh at least every K inferences
    hold_inferences: int = 2  # consecutive cheaper demands before a cheaper tier is taken
    exit_ratio: float = 0.7  # a cue holding its tier lets go below threshold * exit_ratio
    start_full_s: float = 0.3  # episode progress: the first seconds always run full
    # engine signals (ActionChunk.info)
    divergence_full: float = 0.6  # RMS normalised action units over the chunks' overlap
    divergence_partial: float = 0.3
    dissimilarity_full: float = 0.15  # 1 - vision-token cosine similarity, any camera
    # image space (core/scene_change.py: mean abs grey change since the engine encoded it)
    image_change_full: float = 0.12
    image_change_stable: float = 0.03  # at or below: the camera is stable (vision KV reusable)
    camera_stable: dict[str, float] = field(default_factory=dict)  # per-camera override
    # robot motion
    travel_full: float = 0.5  # rad, largest joint displacement since the last full refresh
    acceleration_partial: float = 3.0  # rad/s^2, largest joint
    static_joint_speed: float = 0.02  # rad/s: below, the arm is at rest
    speed_window_s: float = 0.1  # finite-difference window for speed and acceleration
    # gripper (finger opening in m, the unit of the chunk's gripper column and /joint_states)
    gripper_speed: float = 0.01  # m/s measured finger speed: the gripper is moving
    gripper_delta: float = 0.004  # m: a commanded or planned opening change this large
    gripper_plan_steps: int = 8  # look this many actions ahead in the newest chunk

    def __post_init__(self):
        object.__setattr__(self, "tiers", tuple(self.tiers))
        object.__setattr__(self, "camera_stable", dict(self.camera_stable))
        if len(self.tiers) != 4:
            raise ValueError(f"tiers needs 4 compute modes (full … frozen), got {self.tiers}")
        for token in self.tiers:
            ComputeMode.parse(token)
        if self.refresh_every < 1 or self.hold_inferences < 1 or self.gripper_plan_steps < 1:
            raise ValueError("refresh_every, hold_inferences, gripper_plan_steps must be >= 1")
        if not 0.0 < self.exit_ratio <= 1.0:
            raise ValueError(f"exit_ratio must be in (0, 1], got {self.exit_ratio}")
        if self.speed_window_s <= 0:
            raise ValueError("speed_window_s must be > 0")

    def mode(self, tier: int, stable_cameras=None) -> ComputeMode:
        base = ComputeMode.parse(self.tiers[tier])
        if stable_cameras is None:
            return base
        return replace(base, stable_cameras=frozenset(stable_cameras))

    def stable_threshold(self, camera: str) -> float:
        return self.camera_stable.get(camera, self.image_change_stable)

    def is_full_refresh(self, mode: ComputeMode) -> bool:
        """What ran counts as a full refresh: no observation block reused, full denoising."""
        full = ComputeMode.parse(self.tiers[FULL])
        return mode.vision_level <= full.vision_level and mode.denoise_level == 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tiers"] = list(self.tiers)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> SchedulerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown scheduler settings {unknown}; known: {sorted(known)}")
        return cls(**dict(d))

    @classmethod
    def from_yaml(cls, path: str | Path) -> SchedulerConfig:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping of scheduler settings")
        return cls.from_dict(raw.get("scheduler", raw))

    def to_yaml(self) -> str:
        return yaml.safe_dump({"scheduler": self.to_dict()}, sort_keys=False)


# Signals that force a full refresh whatever the cues say (TierPolicy.decide)
FORCING_FLAGS = ("new_episode", "safety_intervention", "gripper_commanded", "gripper_moving",
                 "gripper_planned")  # fmt: skip


@dataclass
class Signals:
    """Everything the decision looks at, as of the next inference (None = not measured yet)."""

    new_episode: bool = False  # instruction (re)published since the last inference
    episode_time_s: float = math.inf
    safety_intervention: bool = False  # `is_intervention` since the last inference
    gripper_commanded: bool = False  # commanded opening changed since the last inference
    gripper_moving: bool = False  # measured finger speed above gripper_speed
    gripper_planned: bool = False  # the newest chunk changes the opening soon
    joint_speed: float | None = None  # rad/s, largest arm joint
    joint_acceleration: float | None = None  # rad/s^2, largest arm joint
    tcp_speed: float | None = None  # m/s (inspection only)
    travel: float | None = None  # rad since the last full refresh, largest arm joint
    image_change: dict[str, float] = field(default_factory=dict)
    dissimilarity: dict[str, float] = field(default_factory=dict)  # 1 - engine similarity
    divergence: float | None = None  # engine chunk divergence (non-warm-started chunks)

    def as_values(self) -> dict[str, float]:
        """Flat name -> number view for diagnostics (booleans as 0/1, unknowns left out)."""
        out: dict[str, float] = {}
        for name, value in asdict(self).items():
            if isinstance(value, dict):
                prefix = "image_change" if name == "image_change" else name
                out.update({f"{prefix}_{cam}": float(v) for cam, v in value.items()})
            elif value is not None and not (isinstance(value, float) and math.isinf(value)):
                out[name] = float(value)
        return out

    @classmethod
    def from_values(cls, values: Mapping[str, float]) -> Signals:
        """The inverse of `as_values` (a recorded decision's numbers; other keys ignored)."""
        known = {f.name for f in fields(cls)} - {"image_change", "dissimilarity"}
        kwargs: dict = {k: values[k] for k in known if k in values}
        for flag in FORCING_FLAGS:
            kwargs[flag] = bool(kwargs.get(flag, 0.0))
        for prefix in ("image_change", "dissimilarity"):
            kwargs[prefix] = {k[len(prefix) + 1 :]: float(v) for k, v in values.items()
                              if k.startswith(prefix + "_")}  # fmt: skip
        return cls(**kwargs)


@dataclass(frozen=True)
class Decision:
    mode: ComputeMode
    tier: int  # after forcing and hysteresis
    demand: int  # what the cues alone asked for
    reasons: tuple[str, ...]  # why not the cheapest tier

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]


class TierPolicy:
    """Signals -> Decision, with the hysteresis and refresh-bound state across inferences.

    `decide` does not change state (it may be called on every new signal); `commit` records
    the inference that actually ran with the last decision."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.tier = FULL
        self.since_full = 0  # inferences since the last full refresh (none yet: forced)
        self.inferences = 0
        self._demands: deque[int] = deque(maxlen=max(1, config.hold_inferences - 1))

    def decide(self, s: Signals) -> Decision:
        c = self.config
        forced = []
        if self.inferences == 0 or s.new_episode:
            forced.append("episode_start")
        elif s.episode_time_s < c.start_full_s:
            forced.append("episode_progress")
        if self.since_full >= c.refresh_every - 1:
            forced.append("refresh_bound")
        if s.gripper_commanded or s.gripper_moving or s.gripper_planned:
            forced.append("gripper")
        if s.safety_intervention:
            forced.append("safety")

        demand, reasons, unstable = self._demand(s)
        if forced:
            return Decision(c.mode(FULL), FULL, demand, tuple(forced + reasons))
        tier = min([demand, *(self._demands if c.hold_inferences > 1 else ())])
        if tier < demand:
            reasons.append("hold")
        stable = None
        if tier == PARTIAL:
            stable = [cam for cam in s.image_change if cam not in unstable]
        return Decision(c.mode(tier, stable), tier, demand, tuple(reasons))

    def _demand(self, s: Signals) -> tuple[int, list[str], set[str]]:
        c = self.config

        def over(value, threshold, cue_tier) -> bool:
            if value is None:
                return False
            holding = self.tier <= cue_tier
            return value > threshold * (c.exit_ratio if holding else 1.0)

        tier, reasons = FROZEN, []

        def need(cue_tier: int, reason: str) -> None:
            nonlocal tier
            tier = min(tier, cue_tier)
            reasons.append(reason)

        if over(s.divergence, c.divergence_full, FULL):
            need(FULL, "divergence")
        if any(over(v, c.dissimilarity_full, FULL) for v in s.dissimilarity.values()):
            need(FULL, "vision_dissimilarity")
        if any(over(v, c.image_change_full, FULL) for v in s.image_change.values()):
            need(FULL, "image_change")
        if over(s.travel, c.travel_full, FULL):
            need(FULL, "travel")
        if over(s.divergence, c.divergence_partial, PARTIAL):
            need(PARTIAL, "divergence")
        if over(s.joint_acceleration, c.acceleration_partial, PARTIAL):
            need(PARTIAL, "acceleration")
        unstable = {
            cam for cam, v in s.image_change.items() if over(v, c.stable_threshold(cam), PARTIAL)
        }
        if unstable:
            need(PARTIAL, "camera_change")
        # No speed measured yet: assume moving (the state token must stay fresh).
        if s.joint_speed is None or s.joint_speed > c.static_joint_speed:
            need(REUSE, "arm_moving")
        return tier, list(dict.fromkeys(reasons)), unstable

    def commit(self, decision: Decision, ran: ComputeMode) -> None:
        """The engine ran `ran` (ActionChunk.mode) for the inference `decision` was made for."""
        self.inferences += 1
        self.since_full = 0 if self.config.is_full_refresh(ran) else self.since_full + 1
        self.tier = decision.tier
        if self.config.hold_inferences > 1:
            self._demands.append(decision.demand)

    def reset(self) -> None:
        self.__init__(self.config)


# ------------------------------------------------------------------------------ signal tracking


class MotionWindow:
    """Arm joint positions over time -> speed and acceleration by finite differences over
    `window_s` (robust to the 1 kHz / 250 Hz jitter of single-sample differences)."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._samples: deque[tuple[float, np.ndarray]] = deque()

    def add(self, t: float, q) -> None:
        q = np.asarray(q, dtype=float)
        if self._samples and t <= self._samples[-1][0]:
            if t < self._samples[-1][0] - self.window_s:  # time jumped back: new clock
                self._samples.clear()
            else:
                return
        self._samples.append((t, q))
        while len(self._samples) > 2 and self._samples[1][0] <= t - 2 * self.window_s:
            self._samples.popleft()

    @property
    def latest(self) -> tuple[float, np.ndarray] | None:
        return self._samples[-1] if self._samples else None

    def _at_or_before(self, t: float) -> tuple[float, np.ndarray] | None:
        best = None
        for sample in self._samples:
            if sample[0] > t + 1e-9:
                break
            best = sample
        return best

    def velocity(self, end: float | None = None) -> np.ndarray | None:
        if not self._samples:
            return None
        end_sample = self._at_or_before(self._samples[-1][0] if end is None else end)
        if end_sample is None:
            return None
        start = self._at_or_before(end_sample[0] - self.window_s)
        if start is None or end_sample[0] - start[0] < 0.5 * self.window_s:
            return None
        return (end_sample[1] - start[1]) / (end_sample[0] - start[0])

    def speed(self) -> float | None:
        v = self.velocity()
        return None if v is None else float(np.abs(v).max())

    def acceleration(self) -> float | None:
        if not self._samples:
            return None
        t = self._samples[-1][0]
        now, before = self.velocity(), self.velocity(t - self.window_s)
        if now is None or before is None:
            return None
        return float(np.abs(now - before).max() / self.window_s)

    def clear(self) -> None:
        self._samples.clear()


class SignalTracker:
    """Raw inputs (joint states, frames, gripper commands, chunks, safety verdicts, engine
    reports) -> `Signals` for the next inference. Event flags last until `commit`."""

    def __init__(self, config: SchedulerConfig, tcp_position: Callable | None = None):
        self.config = config
        self.tcp_position = tcp_position
        self.scene = SceneChange()
        self.motion = MotionWindow(config.speed_window_s)
        self._gripper = MotionWindow(config.speed_window_s)
        self.reset_episode(None)

    def reset_episode(self, t: float | None) -> None:
        self.new_episode = True
        self.episode_start = t
        self._episode_pending = t is None
        self._refresh_q: np.ndarray | None = None
        self._command_at_inference: float | None = None
        self._command: float | None = None
        self._plan: tuple[float, float, np.ndarray] | None = None  # stamp, dt, openings
        self.safety_intervention = False
        self.scene.reset()
        self._dissimilarity: dict[str, float] = {}
        self._divergence: float | None = None

    # -- inputs --------------------------------------------------------------------------------
    def instruction(self) -> None:
        """A (re)published instruction marks a new episode; its clock starts at the next state."""
        latest = self.motion.latest
        self.reset_episode(latest[0] if latest else None)

    def joint_state(self, t: float, q_arm, gripper_opening: float | None = None) -> None:
        self.motion.add(t, q_arm)
        if gripper_opening is not None:
            self._gripper.add(t, [gripper_opening])
        if self._episode_pending:
            self.episode_start, self._episode_pending = t, False

    def image(self, camera: str, image: np.ndarray) -> None:
        self.scene.update(camera, image)

    def gripper_command(self, opening: float) -> None:
        self._command = float(opening)

    def plan(self, stamp: float, dt: float, openings) -> None:
        """The newest chunk's gripper column: action k applies at stamp + (k + 1) * dt."""
        self._plan = (stamp, dt, np.asarray(openings, dtype=float))

    def safety_event(self, event: Mapping) -> None:
        """A safety verdict event (/vla/safety/events)."""
        if is_intervention(event):
            self.safety_intervention = True

    # -- output --------------------------------------------------------------------------------
    def signals(self) -> Signals:
        c = self.config
        latest = self.motion.latest
        now = latest[0] if latest else None
        s = Signals(
            new_episode=self.new_episode,
            safety_intervention=self.safety_intervention,
            joint_speed=self.motion.speed(),
            joint_acceleration=self.motion.acceleration(),
            image_change={
                cam: v for cam in self.scene.cameras if (v := self.scene.change(cam)) is not None
            },
            dissimilarity=dict(self._dissimilarity),
            divergence=self._divergence,
        )
        if now is not None and self.episode_start is not None:
            s.episode_time_s = now - self.episode_start
        if latest is not None and self._refresh_q is not None:
            s.travel = float(np.abs(latest[1] - self._refresh_q).max())
        if self.tcp_position is not None:
            v = self.motion.velocity()
            if v is not None:
                q = latest[1]
                ahead = self.tcp_position(q + v * c.speed_window_s)
                s.tcp_speed = float(np.linalg.norm(ahead - self.tcp_position(q)) / c.speed_window_s)
        if self._command is not None and self._command_at_inference is not None:
            s.gripper_commanded = abs(self._command - self._command_at_inference) > c.gripper_delta
        finger = self._gripper.speed()
        s.gripper_moving = finger is not None and finger > c.gripper_speed
        s.gripper_planned = self._gripper_planned(now)
        return s

    def _gripper_planned(self, now: float | None) -> bool:
        """The newest chunk changes the opening between the action running now and the next
        `gripper_plan_steps` (its plan, not the measured opening: a held object keeps the
        fingers apart while the plan says closed)."""
        if self._plan is None or now is None:
            return False
        stamp, dt, openings = self._plan
        # action k applies from stamp + (k + 1) dt: the one running now, then those ahead
        current = max(0, math.ceil((now - stamp) / dt - 1 - 1e-6) - 1)
        ahead = openings[current : current + 1 + self.config.gripper_plan_steps]
        if ahead.size == 0:
            return False
        return bool(ahead.max() - ahead.min() > self.config.gripper_delta)

    def commit(self, ran: ComputeMode, info: Mapping[str, float]) -> None:
        """The engine reported an inference: `ran` = its ActionChunk.mode (at level 2 its
        stable_cameras = those that may have been reused), `info` = its ActionChunk.info."""
        for key, value in info.items():
            if key.startswith("vision_similarity_"):
                self._dissimilarity[key.removeprefix("vision_similarity_")] = 1.0 - float(value)
        if ran.denoise_level < 2:  # a warm-started chunk is pulled towards its predecessor
            self._divergence = info.get("chunk_divergence", self._divergence)
        if ran.vision_level <= 1:
            encoded = self.scene.cameras
        elif ran.vision_level == 2:
            stable = ran.stable_cameras
            reused = set(self.scene.cameras if stable is None else stable)
            encoded = [cam for cam in self.scene.cameras if cam not in reused]
        else:
            encoded = []
        for cam in encoded:
            self.scene.mark_encoded(cam)
        latest = self.motion.latest
        if self.config.is_full_refresh(ran) and latest is not None:
            self._refresh_q = latest[1].copy()
        self._command_at_inference = self._command
        self.safety_intervention = False
        self.new_episode = False


class PhaseScheduler:
    """`SignalTracker` + `TierPolicy`: what the node runs."""

    def __init__(self, config: SchedulerConfig, tcp_position: Callable | None = None):
        self.config = config
        self.tracker = SignalTracker(config, tcp_position)
        self.policy = TierPolicy(config)
        self.last: tuple[Signals, Decision] | None = None

    def decide(self) -> tuple[Signals, Decision]:
        signals = self.tracker.signals()
        self.last = (signals, self.policy.decide(signals))
        return self.last

    def inference_done(self, ran: ComputeMode, info: Mapping[str, float]) -> None:
        """`ran`: the mode the engine reports (a token carries no camera set: the one offered
        with the last decision is assumed)."""
        decision = self.last[1] if self.last else self.policy.decide(self.tracker.signals())
        if ran.stable_cameras is None:
            ran = replace(ran, stable_cameras=decision.mode.stable_cameras)
        self.policy.commit(decision, ran)
        self.tracker.commit(ran, info)
