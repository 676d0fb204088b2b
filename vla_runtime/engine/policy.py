"""The `Policy` contract (docs/design.md §5): every back end, local or remote, implements it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

import numpy as np

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode


class ActionSpace(StrEnum):
    JOINT_POSITIONS = "joint_positions"
    JOINT_DELTAS = "joint_deltas"
    EE_DELTAS = "ee_deltas"


@dataclass(frozen=True)
class CameraSpec:
    name: str
    height: int
    width: int
    # An earlier frame of another camera: `source`'s image `delay_s` before its newest, so that
    # a policy sees motion (a sliding cube's velocity). "" = a camera of its own.
    source: str = ""
    delay_s: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.source:  # a camera of its own: the same record (and spec hash) as ever
            del d["source"], d["delay_s"]
        return d


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
    # The arm it was trained for (config/robots/<robot>.yaml); "" = not said (remote servers).
    robot: str = ""

    def __post_init__(self):
        names = [c.name for c in self.cameras]
        if len(set(names)) != len(names):
            raise PolicyError(f"camera names repeat: {names}")
        sensors = {c.name for c in self.cameras if not c.source}
        for camera in self.cameras:
            if camera.source and (camera.source not in sensors or not camera.delay_s > 0):
                raise PolicyError(
                    f"camera {camera.name!r}: an earlier frame needs a camera of its own as "
                    f"source and a delay > 0 (got {camera.source!r}, {camera.delay_s} s)"
                )

    @property
    def sensors(self) -> tuple[CameraSpec, ...]:
        """The cameras with images of their own (not an earlier frame of another)."""
        return tuple(c for c in self.cameras if not c.source)

    @property
    def earlier_frames(self) -> tuple[CameraSpec, ...]:
        return tuple(c for c in self.cameras if c.source)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cameras"] = [c.to_dict() for c in self.cameras]
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


@dataclass
class Observation:
    images: dict[str, np.ndarray]  # camera name -> HxWx3 uint8 (rgb8)
    state: np.ndarray  # (state_dim,) float32
    instruction: str
    stamp: float = 0.0  # capture time (s, ROS time) of the newest image
    # Each camera's capture time (a camera rendering less often than the others is older), and
    # when the episode started: a policy with state of its own starts again from there.
    camera_stamps: dict[str, float] = field(default_factory=dict)
    episode_start: float = 0.0


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
