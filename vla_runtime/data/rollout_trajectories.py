"""The arm's path in product-path episodes, kept to branch recovery data off it.

`vla-runtime eval --trajectories DIR` writes one file per episode: the measured arm joints and
the commanded gripper opening, in sim seconds from the episode's start. `collect --replay DIR`
drives the in-process simulator, reset with the same seed, along that path and lets the expert
take over from it: recovery data from the states the policy reaches through the stack in real
time, which a lock-step rollout of the same policy need not visit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vla_runtime.core.gripper import width_from_opening


@dataclass
class RolloutTrajectory:
    task: str
    seed: int
    robot: str
    success: bool
    t: np.ndarray  # (n,) s from the episode's start, increasing
    arm: np.ndarray  # (n, dof) measured joint positions
    gripper_t: np.ndarray  # (m,) s
    gripper_opening: np.ndarray  # (m,) one finger's commanded opening (m)

    @property
    def duration(self) -> float:
        return float(self.t[-1])

    def target(self, t: float) -> tuple[np.ndarray, float | None]:
        """Arm positions and gripper width at `t` (held at the ends); the width is None when
        no gripper command was recorded (the gripper stays as it is)."""
        arm = np.array([np.interp(t, self.t, column) for column in self.arm.T])
        if not len(self.gripper_t):
            return arm, None
        return arm, width_from_opening(float(np.interp(t, self.gripper_t, self.gripper_opening)))


def save_trajectory(directory: Path, trajectory: RolloutTrajectory) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{trajectory.task}_{trajectory.seed}.npz"
    np.savez_compressed(
        path, task=trajectory.task, seed=trajectory.seed, robot=trajectory.robot,
        success=trajectory.success, t=trajectory.t, arm=trajectory.arm,
        gripper_t=trajectory.gripper_t, gripper_opening=trajectory.gripper_opening,
    )  # fmt: skip
    return path


def from_motion(task: str, seed: int, robot: str, success: bool, start: float, motion,
                gripper_commands) -> RolloutTrajectory | None:  # fmt: skip
    """An episode's trajectory from the harness's recorded motion (("state"|"command", stamp,
    arm) and (stamp, opening)), from `start` on; None when no state was recorded."""
    states = sorted((t - start, q) for kind, t, q in motion if kind == "state" and t >= start)
    if len(states) < 2:
        return None
    grips = sorted((t - start, g) for t, g in gripper_commands if t >= start)
    return RolloutTrajectory(
        task, seed, robot, success,
        np.array([t for t, _ in states]), np.array([q for _, q in states], float),
        np.array([t for t, _ in grips], float), np.array([g for _, g in grips], float),
    )  # fmt: skip


def load_trajectories(directory: Path, task: str, robot: str) -> list[RolloutTrajectory]:
    """The trajectories of `task` on `robot` in `directory`, by seed. Raises ValueError when
    there are none."""
    found = []
    for path in sorted(Path(directory).glob("*.npz")):
        with np.load(path) as f:
            if str(f["task"]) != task or str(f["robot"]) != robot:
                continue
            found.append(RolloutTrajectory(
                task, int(f["seed"]), robot, bool(f["success"]), f["t"], f["arm"],
                f["gripper_t"], f["gripper_opening"],
            ))  # fmt: skip
    if not found:
        raise ValueError(f"{directory}: no {task} trajectories of the {robot} "
                         f"(`vla-runtime eval --trajectories DIR` writes them)")  # fmt: skip
    return sorted(found, key=lambda r: r.seed)
