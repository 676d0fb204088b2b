"""The `Policy` contract (docs/design.md §5): every back end, local or remote, implements it."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

import numpy as np


class ActionSpace(StrEnum):
    JOINT_POSITIONS = "joint_positions"
    JOINT_DELTAS = "joint_deltas"
    EE_DELTAS = "ee_deltas"


@dataclass(frozen=True)
class CameraSpec:
    name: str
    height: int
    width: int


@dataclass(frozen=True)
class PolicySpec:
    cameras: tuple[CameraSpec, ...]
    state_dim: int
    action_dim: int  # arm dims + 1 gripper dim when `gripper`
    chunk_len: int  # H
    dt: float  # seconds between consecutive actions of a chunk
    action_space: ActionSpace = ActionSpace.JOINT_POSITIONS
    gripper: bool = True
    joint_names: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["action_space"] = self.action_space.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PolicySpec:
        d = dict(d)
        d["cameras"] = tuple(CameraSpec(**c) for c in d["cameras"])
        d["action_space"] = ActionSpace(d["action_space"])
        d["joint_names"] = tuple(d.get("joint_names", ()))
        return cls(**d)


def _position_offset(state: np.ndarray, spec: PolicySpec) -> np.ndarray:
    """What the policy's actions are relative to: the observed arm joints for joint deltas
    (openpi convention), nothing for joint positions; the gripper is absolute in every space."""
    offset = np.zeros(spec.action_dim)
    if spec.action_space == ActionSpace.JOINT_DELTAS:
        arm = spec.action_dim - (1 if spec.gripper else 0)
        offset[:arm] = np.asarray(state, np.float64)[:arm]
    elif spec.action_space != ActionSpace.JOINT_POSITIONS:
        raise PolicyError(f"no joint positions for action space {spec.action_space.value}")
    return offset


def chunk_to_positions(actions: np.ndarray, state: np.ndarray, spec: PolicySpec) -> np.ndarray:
    """A chunk in the policy's action space -> absolute joint-position rows (policy units),
    relative to the observed state the chunk was inferred from."""
    return np.asarray(actions, np.float64) + _position_offset(state, spec)


def positions_to_chunk(positions: np.ndarray, state: np.ndarray, spec: PolicySpec) -> np.ndarray:
    """Inverse of `chunk_to_positions` (a plan in joint positions -> the policy's actions)."""
    return np.asarray(positions, np.float64) - _position_offset(state, spec)


class PolicyError(ValueError):
    """Raised for malformed observations, plans or compute modes: the caller logs it and
    publishes no chunk."""


@dataclass(frozen=True)
class ComputeMode:
    """Phase-adaptive compute: vision/LLM reuse level 0–4 × denoising level 0–2 (0 = full).

    `stable_cameras` names the cameras the scheduler judges stable (their vision KV may be
    reused at vision level 2); None means every camera. The table of levels is documented in
    `vla_runtime.engine.kv_cache`.
    """

    vision_level: int = 0
    denoise_level: int = 0
    stable_cameras: frozenset[str] | None = None

    def __post_init__(self):
        levels = (self.vision_level, self.denoise_level)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in levels):
            raise PolicyError(f"compute mode levels must be integers: {self}")
        if not (0 <= self.vision_level <= 4 and 0 <= self.denoise_level <= 2):
            raise PolicyError(f"compute mode out of range (vision 0-4, denoise 0-2): {self}")
        if self.stable_cameras is not None:
            object.__setattr__(self, "stable_cameras", frozenset(self.stable_cameras))

    @property
    def token(self) -> str:
        return f"v{self.vision_level}d{self.denoise_level}"

    def to_json(self) -> str:
        d: dict = {"vision_level": self.vision_level, "denoise_level": self.denoise_level}
        if self.stable_cameras is not None:
            d["stable_cameras"] = sorted(self.stable_cameras)
        return json.dumps(d)

    @classmethod
    def parse(cls, text: str) -> ComputeMode:
        """Accept the fixed token (`v2d1`) or a JSON object with the field names."""
        text = text.strip()
        token = re.fullmatch(r"v(\d)d(\d)", text)
        if token:
            return cls(int(token.group(1)), int(token.group(2)))
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PolicyError(
                f"compute mode is neither a token like 'v2d1' nor JSON: {text!r}"
            ) from e
        if not isinstance(d, dict) or not set(d) <= {
            "vision_level",
            "denoise_level",
            "stable_cameras",
        }:
            raise PolicyError(f"compute mode JSON has unknown fields: {text!r}")
        stable = d.get("stable_cameras")
        return cls(
            int(d.get("vision_level", 0)),
            int(d.get("denoise_level", 0)),
            None if stable is None else frozenset(str(c) for c in stable),
        )


FULL_COMPUTE = ComputeMode()


@dataclass
class Observation:
    images: dict[str, np.ndarray]  # camera name -> HxWx3 uint8 (rgb8)
    state: np.ndarray  # (state_dim,) float32
    instruction: str
    stamp: float = 0.0  # capture time (s, ROS time) of the newest image


@dataclass
class ActionChunk:
    actions: np.ndarray  # (H, action_dim) float32
    stamp: float  # = Observation.stamp it was computed from
    mode: ComputeMode = FULL_COMPUTE
    timings_ms: dict[str, float] = field(default_factory=dict)  # vision, backbone, action_head…
    info: dict[str, float] = field(default_factory=dict)  # e.g. rtc_prefix_err, steps


@runtime_checkable
class Policy(Protocol):
    @property
    def spec(self) -> PolicySpec: ...

    def infer(
        self,
        observation: Observation,
        compute_mode: ComputeMode = FULL_COMPUTE,
        plan: np.ndarray | None = None,
        noise_scale: float | None = None,
    ) -> ActionChunk:
        """`plan`: (d, action_dim) actions that will run while this inference happens, in the
        robot's units; plan[k] is applied at observation.stamp + k*dt, like chunk action k. The
        new chunk's first d actions follow it (real-time chunking, `engine/rtc.py`).
        `noise_scale`: this inference's flow start noise instead of the policy's own (None);
        a policy that does not sample ignores it."""
        ...
