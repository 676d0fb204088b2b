"""Consequence rollout: forward-simulate a chunk in a private copy of the MuJoCo scene.

Starting from the scene's current state (all bodies, e.g. from /sim/scene_state), the arm's
position actuators follow the chunk linearly interpolated (as the JointTrajectoryController
would), then the scene settles. The chunk is a hazard when the rollout predicts a contact above
a force threshold (robot against the table, a cube or itself), an object pushed off the table or
into a keep-out box, or the TCP leaving the workspace.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import mujoco
import numpy as np

from vla_runtime.core.gripper import finger_toward, max_finger_speed
from vla_runtime.core.robot import RobotConfig
from vla_runtime.core.safety.workspace import Box, Workcell
from vla_runtime.sim.workcell import (
    GRIPPER_ACTUATOR,
    TABLE_CENTRE_X,
    TABLE_HALF_SIZE,
    gripper_ctrl_per_opening,
)

# Objects must stay above this area: the sim table top.
TABLE_TOP = Box(
    (TABLE_CENTRE_X - TABLE_HALF_SIZE[0], -TABLE_HALF_SIZE[1], -0.05),
    (TABLE_CENTRE_X + TABLE_HALF_SIZE[0], TABLE_HALF_SIZE[1], 2.0),
    "table top",
)

TCP_BEYOND_HAND = 0.1034  # m along the hand's z axis (Franka hand TCP)
# The base stands on the table: its resting contact is not a collision.
BOLTED_BODIES = ("base", "fr3_link0")


@dataclass(frozen=True)
class ConsequenceConfig:
    timestep: float = 0.002  # s; coarser than the driver's 1 ms, for speed
    settle_s: float = 0.2  # s simulated after the last point
    max_contact_force: float = 40.0  # N, robot against an object or itself
    max_table_force: float = 10.0  # N, robot against the table or floor
    object_region: Box = TABLE_TOP  # an object whose centre leaves it fell off the table
    check_every: int = 5  # steps between contact and position checks
    workcell: Workcell = field(default_factory=Workcell)


@dataclass
class Consequence:
    hazards: list[str]
    numbers: dict
    first_hazard_s: float | None = None  # when the first hazard was seen (s from the start)

    @property
    def safe(self) -> bool:
        return not self.hazards


class ConsequenceChecker:
    def __init__(self, model: mujoco.MjModel, robot: RobotConfig, config: ConsequenceConfig):
        self.config = config
        self.robot = robot
        self.model = copy.deepcopy(model)
        self.model.opt.timestep = config.timestep
        self.data = mujoco.MjData(self.model)
        m = self.model
        self._arm_qpos = [m.joint(j).qposadr[0] for j in robot.joints]
        self._arm_dof = [m.joint(j).dofadr[0] for j in robot.joints]
        self._arm_actuators = [m.actuator(j).id for j in robot.joints]
        first = self._arm_actuators[0]
        if self._arm_actuators == list(range(first, first + len(robot.joints))):
            self._arm_actuators = slice(first, first + len(robot.joints))  # a view: faster
        self._gripper = m.actuator(GRIPPER_ACTUATOR).id
        self._ctrl_per_opening = gripper_ctrl_per_opening(m)
        self._finger_step = max_finger_speed(robot) * config.timestep  # as the hand moves them
        root = m.body(BOLTED_BODIES[0]).id
        self._robot_bodies = {b for b in range(m.nbody) if _has_ancestor(m, b, root)}
        self._bolted = {m.body(name).id for name in BOLTED_BODIES}
        self._static = {m.geom(name).id for name in ("table", "floor")}
        # Free bodies are the objects whose fate matters.
        free = [j for j in range(m.njnt) if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        self._object_names = [m.body(m.jnt_bodyid[j]).name for j in free]
        self._object_qpos = np.array([m.jnt_qposadr[j] + np.arange(3) for j in free], int)
        self._object_qpos = self._object_qpos.reshape(len(free), 3)
        workspace = config.workcell.workspace
        self._plane_normals = np.array([p.normal for p in workspace], float).reshape(-1, 3)
        self._plane_offsets = np.array([p.offset for p in workspace], float)
        self._hand = m.body("hand").id
        self._force = np.zeros(6)

    @classmethod
    def from_xml(cls, xml: str, robot: RobotConfig, config: ConsequenceConfig):
        return cls(mujoco.MjModel.from_xml_string(xml), robot, config)

    def rollout(
        self, qpos, arm_velocity, times, arm_positions, gripper_openings=None
    ) -> Consequence:
        """Simulate from the full generalized positions `qpos` (arm moving at `arm_velocity`)
        through the chunk: `times` (s from now, increasing, > 0) and `arm_positions` (n, dof)
        in robot joint order; `gripper_openings` (n,), the chunk's gripper column (one finger's
        opening in m), or None to keep the gripper."""
        cfg, m, d = self.config, self.model, self.data
        mujoco.mj_resetData(m, d)
        d.qpos[:] = qpos
        d.qvel[self._arm_dof] = arm_velocity
        start = d.qpos[self._arm_qpos].copy()
        times = np.concatenate([[0.0], np.asarray(times, dtype=float)])
        path = np.vstack([start, np.asarray(arm_positions, dtype=float)])
        d.ctrl[self._arm_actuators] = start
        if gripper_openings is not None:
            openings = np.concatenate([[gripper_openings[0]], np.asarray(gripper_openings, float)])
        mujoco.mj_forward(m, d)
        start_objects = _Start(d.qpos[self._object_qpos], cfg)

        hazards: dict[str, str] = {}
        first_hazard = None
        numbers = {"max_contact_n": 0.0, "max_table_contact_n": 0.0, "max_object_shift_m": 0.0}
        n_steps = int(np.ceil((times[-1] + cfg.settle_s) / cfg.timestep))
        step_times = cfg.timestep * np.arange(1, n_steps + 1)
        arm_ctrl = np.column_stack([np.interp(step_times, times, col) for col in path.T])
        if gripper_openings is not None:
            gripper_ctrl = self._ctrl_per_opening * rate_limited(
                np.interp(step_times, times, openings), openings[0], self._finger_step
            )
        for step in range(n_steps):
            d.ctrl[self._arm_actuators] = arm_ctrl[step]
            if gripper_openings is not None:
                d.ctrl[self._gripper] = gripper_ctrl[step]
            mujoco.mj_step(m, d)
            if (step + 1) % cfg.check_every == 0 or step + 1 == n_steps:
                t = float(step_times[step])
                self._check_contacts(hazards, numbers, t)
                self._check_places(hazards, numbers, t, start_objects)
                if hazards and first_hazard is None:
                    first_hazard = t
        return Consequence(list(hazards.values()), numbers, first_hazard)

    # -- checks ------------------------------------------------------------------------------
    def _check_contacts(self, hazards: dict, numbers: dict, t: float) -> None:
        m, d, cfg = self.model, self.data, self.config
        for i in range(d.ncon):
            contact = d.contact[i]
            b1, b2 = m.geom_bodyid[contact.geom1], m.geom_bodyid[contact.geom2]
            robot1, robot2 = b1 in self._robot_bodies, b2 in self._robot_bodies
            if not (robot1 or robot2):
                continue
            mujoco.mj_contactForce(m, d, i, self._force)
            force = abs(float(self._force[0]))
            static = contact.geom1 in self._static or contact.geom2 in self._static
            if static:
                if (b1 if robot1 else b2) in self._bolted:
                    continue
                numbers["max_table_contact_n"] = max(numbers["max_table_contact_n"], force)
                if force > cfg.max_table_force:
                    hazards.setdefault(
                        "table", f"robot presses the table with {force:.1f} N at t={t:.2f} s"
                    )
                continue
            numbers["max_contact_n"] = max(numbers["max_contact_n"], force)
            if force > cfg.max_contact_force:
                other = m.body(b2 if robot1 else b1).name
                what = "itself" if robot1 and robot2 else other
                hazards.setdefault(
                    f"contact {what}", f"collision with {what}: {force:.1f} N at t={t:.2f} s"
                )

    def _check_places(self, hazards: dict, numbers: dict, t: float, start: _Start) -> None:
        d, cfg = self.data, self.config
        places = d.qpos[self._object_qpos]
        if len(places):
            shift = float(np.max(np.linalg.norm(places - start.places, axis=1)))
            numbers["max_object_shift_m"] = max(numbers["max_object_shift_m"], shift)
            fell = ~cfg.object_region.contains(places) & start.on_region
            entered = [box.contains(places) & ~inside for box, inside in start.in_boxes]
            if fell.any() or any(e.any() for e in entered):
                for i, name in enumerate(self._object_names):
                    if fell[i]:
                        hazards.setdefault(
                            f"off {name}", f"{name} pushed off the table at t={t:.2f} s"
                        )
                    for (box, _), into in zip(start.in_boxes, entered, strict=True):
                        if into[i]:
                            hazards.setdefault(
                                f"box {name}",
                                f"{name} pushed into keep-out box {box.name} at t={t:.2f} s",
                            )
        hand = d.xpos[self._hand] + TCP_BEYOND_HAND * d.xmat[self._hand].reshape(3, 3)[:, 2]
        outside = self._plane_normals @ hand > self._plane_offsets
        if outside.any():
            for plane, out in zip(cfg.workcell.workspace, outside, strict=True):
                if out:
                    hazards.setdefault(
                        "workspace", f"TCP leaves the workspace ({plane.name}) at t={t:.2f} s"
                    )


class _Start:
    """Where the objects were when the rollout began, and which regions held them then."""

    def __init__(self, places: np.ndarray, config: ConsequenceConfig):
        self.places = places
        self.on_region = config.object_region.contains(places)
        self.in_boxes = [(box, box.contains(places)) for box in config.workcell.keep_out]


def _has_ancestor(model: mujoco.MjModel, body: int, ancestor: int) -> bool:
    while body != 0:
        if body == ancestor:
            return True
        body = model.body_parentid[body]
    return ancestor == 0


def rate_limited(values: np.ndarray, start: float, max_step: float) -> np.ndarray:
    """`values` followed from `start` moving at most `max_step` per sample."""
    out = np.empty_like(values)
    current = float(start)
    for k, value in enumerate(values):
        current = out[k] = finger_toward(current, float(value), max_step)
    return out
