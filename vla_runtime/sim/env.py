"""The in-process task environment (simulator and renderers in this process, no ROS) and what
every collection and evaluation environment shares: the frame, the cameras, one control period
of physics, the action clip the harness applies.

`stack.sim_harness.RosEnv` is the same interface over the node stack (`reset(seed) -> Frame`,
`step(q, width) -> Frame`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vla_runtime.core.gripper import opening_from_width
from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD
from vla_runtime.sim.render import SceneRenderer  # sets MUJOCO_GL before mujoco loads
from vla_runtime.sim.tasks import CONTROL_DT, TaskSimulator

DEFAULT_IMAGE_SIZE = 96
CAMERAS = ("scene", "wrist")
PHYSICS_STEPS = round(CONTROL_DT / 0.001)


class CommandRefused(RuntimeError):
    """The simulated arm refused a command (a reflex: too fast, out of range, ...)."""


def clip_to_limits(rows: np.ndarray, robot, gripper_max: float | None = None) -> np.ndarray:
    """Joint-limit clip of chunk rows (arm joints + gripper column), what the safety node's
    clip verdict does; the harness applies it on every path so one stray action beyond a limit
    does not make the driver reject the whole chunk."""
    rows = np.array(rows, dtype=float)
    dof = robot.dof
    rows[:, :dof] = np.clip(rows[:, :dof], robot.position_min, robot.position_max)
    top = robot.gripper_max_width if gripper_max is None else gripper_max
    rows[:, dof] = np.clip(rows[:, dof], 0.0, top)
    return rows


@dataclass
class Frame:
    """One synchronised observation: images, policy state (arm joints + width), full qpos."""

    time: float
    images: dict[str, np.ndarray]
    state: np.ndarray
    qpos: np.ndarray


class InProcessEnv:
    """Simulator + renderers in this process (no ROS): fast and deterministic."""

    def __init__(self, task: str, image_size: int = DEFAULT_IMAGE_SIZE, cameras=CAMERAS,
                 robot: str = "fr3", servo_feedforward: bool = SIM_SERVO_FEEDFORWARD):  # fmt: skip
        self.sim = TaskSimulator(task, robot=robot, servo_feedforward=servo_feedforward)
        self.renderers = {
            c: SceneRenderer(self.sim.xml, c, image_size, image_size) for c in cameras
        }
        self.model = self.sim.model
        self.robot = self.sim.robot
        self._names = (*self.sim.robot.joints, self.sim.robot.gripper_joints[0])

    @property
    def setup(self):
        return self.sim.setup

    def _frame(self) -> Frame:
        qpos = self.sim.qpos
        images = {c: r.render(qpos) for c, r in self.renderers.items()}
        state = np.append(self.sim.arm_positions, self.sim.gripper_width).astype(np.float32)
        return Frame(self.sim.time, images, state, qpos)

    def reset(self, seed: int) -> Frame:
        self.sim.randomize(seed)
        self.sim.step(PHYSICS_STEPS)  # settle one period, like the ROS path
        return self._frame()

    def step(self, q, width) -> Frame:
        row = [*q, opening_from_width(width)]
        reason = self.sim.set_trajectory(self._names, [row], [CONTROL_DT])
        if reason is not None:
            raise CommandRefused(f"command refused: {reason}")
        self.sim.step(PHYSICS_STEPS)
        return self._frame()

    def close(self) -> None:
        for renderer in self.renderers.values():
            renderer.close()
