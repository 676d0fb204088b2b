"""How a robot's joint state becomes the policy state and how actions become joint positions.

The gripper is the policy's one state value (the fingers' sum, their mean, or none); the chunk
column that carries it holds one finger's opening (the unit a JointTrajectoryController and the
sim driver take).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.robot import load_robot
from vla_runtime.engine.policy import (
    ActionSpace,
    PolicySpec,
    chunk_to_positions,
    positions_to_chunk,
)

GRIPPER_STATES = ("sum", "mean", "none")
# Where the gripper's state comes from: its joints on /joint_states; the opening the safety gate
# last commanded (a gripper without feedback, e.g. a UR's tool-flange gripper); or its joints
# where the joint state has them, else the commands.
GRIPPER_SOURCES = ("joints", "commands", "auto")


class SyncError(RuntimeError):
    """The inputs do not form a usable observation (missing or stale camera or state)."""


class AwaitingEpisode(SyncError):
    """A new episode began and its first camera frame or joint state has not come yet: the
    normal start of every episode, not a fault."""


@dataclass(frozen=True)
class StateMapping:
    """How /joint_states becomes the policy state and how actions become joint positions."""

    arm_joints: tuple[str, ...]
    gripper_joints: tuple[str, ...] = ()
    gripper_state: str = "sum"  # sum | mean | none
    # The chunk column carrying the gripper: by default the first finger joint, holding one
    # finger's opening (width / 2 for a two-finger gripper), the unit a JointTrajectoryController
    # and the sim driver take (core/topics.py).
    gripper_name: str = ""

    def __post_init__(self):
        if self.gripper_state not in GRIPPER_STATES:
            raise ValueError(f"gripper_state must be one of {GRIPPER_STATES}")
        if self.gripper_state != "none" and not self.gripper_joints:
            raise ValueError(f"gripper_state '{self.gripper_state}' needs gripper_joints")

    @classmethod
    def for_robot(
        cls,
        robot: str,
        arm_joints: Sequence[str] = (),
        gripper_joints: Sequence[str] = (),
        gripper_state: str = "sum",
        gripper_name: str = "",
        joint_prefix: str = "",
    ) -> StateMapping:
        """The mapping of `arm_joints` and `gripper_joints`; those not given are the robot's
        (config/robots/<robot>.yaml), named as on ROS with `joint_prefix`."""
        if not arm_joints or (gripper_state != "none" and not gripper_joints) or not gripper_name:
            config = load_robot(robot, joint_prefix)
            arm_joints = arm_joints or config.joints
            gripper_joints = gripper_joints or config.gripper_joints
        return cls(tuple(arm_joints), tuple(gripper_joints or ()), gripper_state, gripper_name)

    @property
    def has_gripper(self) -> bool:
        return self.gripper_state != "none"

    @property
    def state_dim(self) -> int:
        return len(self.arm_joints) + int(self.has_gripper)

    @property
    def joint_names(self) -> list[str]:
        gripper = self.gripper_name or (self.gripper_joints[:1] and self.gripper_joints[0])
        return [*self.arm_joints, *([gripper] if self.has_gripper else [])]

    @property
    def _gripper_scale(self) -> float:
        """Policy gripper value -> published per-finger opening."""
        return 1.0 / len(self.gripper_joints) if self.gripper_state == "sum" else 1.0

    def state_from(self, names, positions) -> np.ndarray:
        """State vector from a JointState's names/positions; SyncError names missing joints."""
        index = {name: i for i, name in enumerate(names)}
        wanted = self.arm_joints + (self.gripper_joints if self.has_gripper else ())
        missing = [j for j in wanted if j not in index or index[j] >= len(positions)]
        if missing:
            raise SyncError(f"joint state lacks {missing}")
        arm = [positions[index[j]] for j in self.arm_joints]
        if self.has_gripper:
            fingers = [positions[index[j]] for j in self.gripper_joints]
            arm.append(sum(fingers) if self.gripper_state == "sum" else sum(fingers) / len(fingers))
        state = np.asarray(arm, dtype=np.float32)
        if not np.all(np.isfinite(state)):
            raise SyncError(f"joint state is not finite: {state.tolist()}")
        return state

    def with_commanded_gripper(self, names, positions, opening: float, source: str):
        """The joint state (names, positions) with the fingers at the commanded `opening`
        (one finger's, as the gate publishes it) where `source` says so: always for
        "commands", for "auto" only where the joint state lacks the fingers. Returns the
        state and whether the commanded opening stands in for the fingers."""
        if source not in GRIPPER_SOURCES:
            raise ValueError(f"gripper source must be one of {GRIPPER_SOURCES}, got {source!r}")
        if not self.has_gripper or source == "joints":
            return names, positions, False
        fingers = self.gripper_joints
        if source == "auto" and all(f in names for f in fingers):
            return names, positions, False
        kept = [(n, p) for n, p in zip(names, positions, strict=False) if n not in fingers]
        names = [n for n, _ in kept] + list(fingers)
        return names, [p for _, p in kept] + [opening] * len(fingers), True

    def check_spec(self, spec: PolicySpec, robot: str = "") -> None:
        """Refuses, with one line, a policy whose columns are not this mapping's; `robot`: the
        arm driven, which a checkpoint trained for another arm does not fit even when the
        shapes agree (an FR3 policy on a Panda)."""
        if spec.robot and robot and spec.robot != robot:
            raise ValueError(
                f"the policy was trained for robot '{spec.robot}', this engine drives '{robot}': "
                f"use a {robot} checkpoint"
            )
        if spec.state_dim != self.state_dim:
            raise ValueError(
                f"policy state_dim {spec.state_dim} != {len(self.arm_joints)} arm joints"
                f"{' + 1 gripper' if self.has_gripper else ''}: set arm_joints/gripper_state"
            )
        if spec.action_dim != self.state_dim:
            raise ValueError(
                f"policy action_dim {spec.action_dim} does not match the {self.state_dim} "
                f"columns {self.joint_names}"
            )
        if spec.action_space == ActionSpace.EE_DELTAS:
            raise ValueError("end-effector delta policies need an IK stage; not supported here")

    def to_positions(self, actions: np.ndarray, state: np.ndarray, spec: PolicySpec):
        """Chunk actions -> published joint-position rows (per-finger gripper opening)."""
        positions = chunk_to_positions(actions, state, spec)
        if self.has_gripper:
            positions[:, -1] *= self._gripper_scale
        return positions

    def to_actions(self, positions: np.ndarray, state: np.ndarray, spec: PolicySpec):
        """Inverse of `to_positions` (for the guidance plan)."""
        rows = np.array(positions, dtype=np.float64)
        if self.has_gripper:
            rows[:, -1] /= self._gripper_scale
        return positions_to_chunk(rows, state, spec).astype(np.float32)
