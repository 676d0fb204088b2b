"""The `Policy` contract (DESIGN.md §5): every back end, local or remote, implements it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable

import numpy as np


class ActionSpace(str, Enum):
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


@dataclass(frozen=True)
class ComputeMode:
    """Phase-adaptive compute: vision/LLM reuse level 0–4 × denoising level 0–2 (0 = full)."""

    vision_level: int = 0
    denoise_level: int = 0

    def __post_init__(self):
        if not (0 <= self.vision_level <= 4 and 0 <= self.denoise_level <= 2):
            raise ValueError(f"compute mode out of range: {self}")

    @property
    def token(self) -> str:
        return f"v{self.vision_level}d{self.denoise_level}"


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
    info: dict[str, float] = field(default_factory=dict)


class PolicyError(ValueError):
    """Raised for malformed observations or plans: the caller logs it and publishes no chunk."""


@runtime_checkable
class Policy(Protocol):
    @property
    def spec(self) -> PolicySpec: ...

    def infer(
        self,
        observation: Observation,
        compute_mode: ComputeMode = FULL_COMPUTE,
        plan: np.ndarray | None = None,
    ) -> ActionChunk:
        """`plan`: (d, action_dim) actions that will run while this inference happens (RTC)."""
        ...
