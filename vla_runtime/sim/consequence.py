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
from vla_runtime.sim.simulator import servo_fed_forward, velocity_lead_s
from vla_runtime.sim.workcell import (
    GRIPPER_ACTUATOR,
    TABLE_CENTRE_X,
    TABLE_HALF_SIZE,
    TCP_SITE,
    gripper_ctrl_per_opening,
)

# Objects must stay above this area: the sim table top.
TABLE_TOP = Box(
    (TABLE_CENTRE_X - TABLE_HALF_SIZE[0], -TABLE_HALF_SIZE[1], -0.05),
    (TABLE_CENTRE_X + TABLE_HALF_SIZE[0], TABLE_HALF_SIZE[1], 2.0),
    "table top",
)

# Object places and the TCP are judged this many checks at a time (one array pass per block,
# not per check); a hazard ends the rollout within one block.
BLOCK = 10
IGNORED, TABLE, OTHER, SELF = 0, 1, 2, 3  # how a contact is judged
# The hand's own bodies touch each other when it closes on nothing: gripping, not a collision.
HAND_BODIES = ("hand", "left_finger", "right_finger")


@dataclass(frozen=True)
class ConsequenceConfig:
    timestep: float = 0.0025  # s; coarser than the driver's 1 ms, for speed
    # s simulated after the last point: the lagging servo coasts on for ~0.3 s after its
    # setpoint stops, and what it presses then is the chunk's doing too
    settle_s: float = 0.3
    max_contact_force: float = 40.0  # N, robot against an object (pushes and grasps press)
    max_table_force: float = 5.0  # N, robot against the table or floor
    max_self_force: float = 5.0  # N, one link against another (no task needs that)
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


@dataclass
class _Run:
    """A rollout's inputs and, per check, what it saw and the state after it: a later rollout
    of a prefix of the same chunk from the same state resumes from them."""

    qpos: np.ndarray
    arm_velocity: np.ndarray
    times: np.ndarray  # with the start at 0
    path: np.ndarray  # (len(times), dof)
    openings: np.ndarray | None
    start: _Start
    check_t: np.ndarray  # (checks,) s
    states: np.ndarray  # (checks, state size)
    places: np.ndarray  # (checks, objects, 3)
    tcp: np.ndarray  # (checks, 3)
    forces: np.ndarray  # (checks, 2): the hardest press on the table, the hardest other contact
    contact_hazards: dict[int, dict] = field(default_factory=dict)  # check: hazards
    checked: int = 0  # checks judged free of hazards


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
        # The servo as the scene's driver runs it: fed the setpoint's velocity, or lagging.
        self._lead = velocity_lead_s(m, self._arm_actuators) if servo_fed_forward(m) else None
        self._gripper = m.actuator(GRIPPER_ACTUATOR).id
        self._ctrl_per_opening = gripper_ctrl_per_opening(m)
        self._finger_step = max_finger_speed(robot) * config.timestep  # as the hand moves them
        bodies, bolted = robot_bodies(m, robot.joints[0])
        self._pair_kind, self._geom_robot = _pair_kinds(m, bodies, bolted)
        # The workcell (workspace planes, keep-out boxes) is given in the robot's base frame,
        # the body under its first joint; the table top in the scene's.
        base = bolted[0] if bolted else 0  # the world's body when nothing is bolted
        mujoco.mj_forward(m, self.data)
        self._base_origin = self.data.xpos[base].copy()
        self._base_rotation = self.data.xmat[base].reshape(3, 3).copy()
        self._elliptic = m.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC
        # Per constraint type: whose rows sum to a contact's normal force.
        self._summed_rows = np.zeros(len(mujoco.mjtConstraint.__members__), bool)
        self._summed_rows[mujoco.mjtConstraint.mjCNSTR_CONTACT_FRICTIONLESS] = True
        self._summed_rows[mujoco.mjtConstraint.mjCNSTR_CONTACT_PYRAMIDAL] = True
        # Free bodies are the objects whose fate matters.
        free = [j for j in range(m.njnt) if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        self._object_names = [m.body(m.jnt_bodyid[j]).name for j in free]
        self._object_qpos = np.array([m.jnt_qposadr[j] + np.arange(3) for j in free], int)
        self._object_qpos = self._object_qpos.reshape(len(free), 3)
        workcell = config.workcell
        # The regions objects are judged against: the table top (leaving it is the hazard),
        # then each keep-out box (entering one is).
        self._boxes = workcell.keep_out
        self._region_lo = np.array([r.lo for r in (config.object_region, *self._boxes)], float)
        self._region_hi = np.array([r.hi for r in (config.object_region, *self._boxes)], float)
        self._entering = np.arange(len(self._region_lo)) > 0
        self._plane_normals = np.array([p.normal for p in workcell.workspace], float).reshape(-1, 3)
        self._plane_offsets = np.array([p.offset for p in workcell.workspace], float)
        self._tcp = m.site(TCP_SITE).id
        self._state_kind = mujoco.mjtState.mjSTATE_INTEGRATION
        self._state_size = mujoco.mj_stateSize(m, self._state_kind)
        self._last: _Run | None = None

    @classmethod
    def from_xml(cls, xml: str, robot: RobotConfig, config: ConsequenceConfig):
        return cls(mujoco.MjModel.from_xml_string(xml), robot, config)

    def rollout(
        self, qpos, arm_velocity, times, arm_positions, gripper_openings=None
    ) -> Consequence:
        """Simulate from the full generalized positions `qpos` (arm moving at `arm_velocity`)
        through the chunk: `times` (s from now, increasing, > 0) and `arm_positions` (n, dof)
        in robot joint order; `gripper_openings` (n,), the chunk's gripper column (one finger's
        opening in m), or None to keep the gripper.

        The result ends at the first check that sees a hazard: what follows changes neither
        whether nor when, and the simulation stops within BLOCK checks of it. A prefix of the
        previous rollout's chunk from the same state (the chunk truncated before its hazard)
        resumes the previous simulation from its last hazard-free check before the prefix
        ends: up to there, both are the same simulation."""
        cfg, m, d = self.config, self.model, self.data
        qpos = np.array(qpos, dtype=float)
        arm_velocity = np.array(arm_velocity, dtype=float)
        times = np.concatenate([[0.0], np.asarray(times, dtype=float)])
        path = np.vstack([qpos[self._arm_qpos], np.asarray(arm_positions, dtype=float)])
        openings = None
        if gripper_openings is not None:
            openings = np.asarray(gripper_openings, dtype=float)
            openings = np.concatenate([openings[:1], openings])
        n_steps = int(np.ceil((times[-1] + cfg.settle_s) / cfg.timestep))
        step_times = cfg.timestep * np.arange(1, n_steps + 1)
        ctrl = self._controls(d.ctrl.size, step_times, times, path, openings)
        run = self._resumed(qpos, arm_velocity, times, path, openings)
        if run is None:
            run = self._start(
                qpos, arm_velocity, times, path, openings, -(-n_steps // cfg.check_every)
            )
        check = judged = run.checked
        for step in range(check * cfg.check_every, n_steps):
            d.ctrl[:] = ctrl[step]
            mujoco.mj_step(m, d)
            last = step + 1 == n_steps
            if (step + 1) % cfg.check_every and not last:
                continue
            self._record(run, check, float(step_times[step]))
            check += 1
            if check - judged == BLOCK or last:
                hazard = self._first_hazard(run, judged, check)
                if hazard is not None:
                    return self._result(run, hazard + 1, hazard)
                run.checked = judged = check
        return self._result(run, check, None)

    # -- the simulation ----------------------------------------------------------------------
    def _controls(self, nu: int, step_times, times, path, openings) -> np.ndarray:
        """(steps, nu): the arm following the path linearly interpolated (with the servo fed
        forward, plus its lead times each segment's velocity; none after the last point), the
        gripper the openings at the hand's speed, the rest as a reset leaves it (0)."""
        ctrl = np.zeros((len(step_times), nu))
        for k, column in enumerate(path.T):
            ctrl[:, self._arm_actuators[k]] = np.interp(step_times, times, column)
        if self._lead is not None:
            segment = np.searchsorted(times, step_times, side="right") - 1
            moving = segment < len(times) - 1
            slopes = np.diff(path, axis=0) / np.diff(times)[:, None]
            ctrl[np.ix_(moving, self._arm_actuators)] += self._lead * slopes[segment[moving]]
        if openings is not None:
            goal = np.interp(step_times, times, openings)
            moved = rate_limited(goal, openings[0], self._finger_step)
            ctrl[:, self._gripper] = self._ctrl_per_opening * moved
        return ctrl

    def _start(self, qpos, arm_velocity, times, path, openings, checks: int) -> _Run:
        """The scene at `qpos`, the arm moving at `arm_velocity` and commanded where it is."""
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        d.qpos[:] = qpos
        d.qvel[self._arm_dof] = arm_velocity
        d.ctrl[self._arm_actuators] = path[0]
        mujoco.mj_forward(m, d)
        places = d.qpos[self._object_qpos]
        start = _Start(places, self._holding(places[None])[0])
        self._last = _Run(
            qpos, arm_velocity, times, path, openings, start, np.empty(checks),
            np.empty((checks, self._state_size)), np.empty((checks, *places.shape)),
            np.empty((checks, 3)), np.empty((checks, 2)),
        )  # fmt: skip
        return self._last

    def _resumed(self, qpos, arm_velocity, times, path, openings) -> _Run | None:
        """The previous run, set back to its last check before this chunk ends, when this chunk
        is a prefix of its chunk from the same state; else None."""
        last, k = self._last, len(times)
        if last is None or k > len(last.times) or (openings is None) != (last.openings is None):
            return None
        same = (
            np.array_equal(qpos, last.qpos)
            and np.array_equal(arm_velocity, last.arm_velocity)
            and np.array_equal(times, last.times[:k])
            and np.array_equal(path, last.path[:k])
            and (openings is None or np.array_equal(openings, last.openings[:k]))
        )
        if not same:
            return None
        # Checks strictly before the prefix's last point: their controls are the same.
        every = self.config.check_every * self.config.timestep
        checks = min(last.checked, int(np.ceil(times[-1] / every)) - 1)
        if checks <= 0:
            return None
        mujoco.mj_setState(self.model, self.data, last.states[checks - 1], self._state_kind)
        # From here on the run is this chunk's: a later prefix is judged against it.
        last.times, last.path, last.openings = times, path, openings
        last.checked, last.contact_hazards = checks, {}
        return last

    # -- checks ------------------------------------------------------------------------------
    def _record(self, run: _Run, check: int, t: float) -> None:
        """What check `check` at `t` (s) sees; contacts are judged now, places in blocks."""
        m, d = self.model, self.data
        run.check_t[check] = t
        mujoco.mj_getState(m, d, run.states[check], self._state_kind)
        run.places[check] = d.qpos[self._object_qpos]
        run.tcp[check] = self._in_base(d.site_xpos[self._tcp])
        run.forces[check] = 0.0
        if d.ncon:
            self._judge_contacts(run, check, t)

    def _judge_contacts(self, run: _Run, check: int, t: float) -> None:
        m, cfg = self.model, self.config
        geoms = self.data.contact.geom
        kind = self._pair_kind[geoms[:, 0], geoms[:, 1]]
        if not kind.any():
            return
        forces = self._normal_forces()
        table = forces[kind == TABLE].max(initial=0.0)
        other = np.where((kind == OTHER) | (kind == SELF), forces, 0.0)
        run.forces[check] = table, other.max()
        hazards = {}
        if table > cfg.max_table_force:
            hazards["table"] = f"robot presses the table with {table:.1f} N at t={t:.2f} s"
        limit = np.where(kind == SELF, cfg.max_self_force, cfg.max_contact_force)
        for i in np.nonzero(other > limit)[0]:
            robot = self._geom_robot[geoms[i]]
            hit = geoms[i, 1] if robot[0] else geoms[i, 0]
            what = "itself" if robot.all() else m.body(m.geom_bodyid[hit]).name
            hazards.setdefault(
                f"contact {what}", f"collision with {what}: {other[i]:.1f} N at t={t:.2f} s"
            )
        if hazards:
            run.contact_hazards[check] = hazards

    def _normal_forces(self) -> np.ndarray:
        """Each contact's normal force (N), as mj_contactForce gives it: its first row in an
        elliptic cone, else the sum of its rows (a pyramid's edges); 0 when inactive."""
        d = self.data
        if self._elliptic:
            first = d.contact.efc_address
            return np.abs(np.where(first >= 0, d.efc_force[np.maximum(first, 0)], 0.0))
        rows = self._summed_rows[d.efc_type]
        return np.abs(np.bincount(d.efc_id[rows], d.efc_force[rows], minlength=d.ncon))

    def _in_base(self, points: np.ndarray) -> np.ndarray:
        """Scene points (..., 3) in the robot's base frame."""
        return (points - self._base_origin) @ self._base_rotation

    def _holding(self, places: np.ndarray) -> np.ndarray:
        """(checks, objects, regions): whether each place (scene frame) lies in each region."""
        table = _inside(places, self._region_lo[:1], self._region_hi[:1])
        boxes = _inside(self._in_base(places), self._region_lo[1:], self._region_hi[1:])
        return np.concatenate([table, boxes], axis=-1)

    def _first_hazard(self, run: _Run, begin: int, end: int) -> int | None:
        """The first of checks begin..end - 1 that sees a hazard, or None."""
        inside = self._holding(run.places[begin:end])
        # Leaving the table top and entering a keep-out box are the hazards.
        moved = (inside != run.start.inside) & (inside == self._entering)
        outside = run.tcp[begin:end] @ self._plane_normals.T > self._plane_offsets
        bad = moved.any(axis=(1, 2)) | outside.any(axis=1)
        for check in run.contact_hazards:
            if begin <= check < end:
                bad[check - begin] = True
        return begin + int(np.argmax(bad)) if bad.any() else None

    def _result(self, run: _Run, checks: int, hazard: int | None) -> Consequence:
        """The consequence of the first `checks` checks, the last one seeing `hazard`."""
        shift = ((run.places[:checks] - run.start.places) ** 2).sum(axis=-1)
        numbers = {
            "max_contact_n": float(run.forces[:checks, 1].max(initial=0.0)),
            "max_table_contact_n": float(run.forces[:checks, 0].max(initial=0.0)),
            "max_object_shift_m": float(np.sqrt(shift.max(initial=0.0))),
        }
        if hazard is None:
            return Consequence([], numbers, None)
        run.checked = hazard  # the checks before it were free of hazards
        t = float(run.check_t[hazard])
        hazards = dict(run.contact_hazards.get(hazard, {}))
        self._name_places(hazards, run, hazard, t)
        return Consequence(list(hazards.values()), numbers, t)

    def _name_places(self, hazards: dict, run: _Run, check: int, t: float) -> None:
        inside = self._holding(run.places[check][None])[0]
        moved = (inside != run.start.inside) & (inside == self._entering)
        for i, name in enumerate(self._object_names):
            if moved[i, 0]:
                hazards.setdefault(f"off {name}", f"{name} pushed off the table at t={t:.2f} s")
            for box, into in zip(self._boxes, moved[i, 1:], strict=True):
                if into:
                    hazards.setdefault(
                        f"box {name}", f"{name} pushed into keep-out box {box.name} at t={t:.2f} s"
                    )
        outside = self._plane_normals @ run.tcp[check] > self._plane_offsets
        if outside.any():
            plane = self.config.workcell.workspace[int(np.argmax(outside))]
            hazards.setdefault(
                "workspace", f"TCP leaves the workspace ({plane.name}) at t={t:.2f} s"
            )


@dataclass
class _Start:
    """Where the objects were when the rollout began, and which regions held them then."""

    places: np.ndarray  # (objects, 3)
    inside: np.ndarray  # (objects, regions)


def _inside(places: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(checks, objects, regions): whether each place lies in each box [lo, hi]."""
    p = places[..., None, :]
    return ((p >= lo) & (p <= hi)).all(axis=-1)


def robot_bodies(m: mujoco.MjModel, first_joint: str) -> tuple[list[int], list[int]]:
    """The robot's bodies (its root's subtree) and those of them bolted down: the base bodies
    above the first arm joint, which no joint moves and whose resting contacts are no collision."""
    moving = int(m.jnt_bodyid[m.joint(first_joint).id])
    bolted, body = [], int(m.body_parentid[moving])
    while body != 0:
        bolted.append(body)
        body = int(m.body_parentid[body])
    root = bolted[-1] if bolted else moving
    return [b for b in range(m.nbody) if _has_ancestor(m, b, root)], bolted


def _pair_kinds(m: mujoco.MjModel, bodies, bolted_bodies) -> tuple[np.ndarray, np.ndarray]:
    """(ngeom, ngeom): how a contact between two geoms is judged: TABLE (the robot, but its
    bolted base, against the table or floor), SELF (one robot body against another, but the
    hand's own), OTHER (the robot against an object, or the hand against itself), else
    IGNORED; and (ngeom,): which geoms are the robot's."""
    robot = np.isin(m.geom_bodyid, bodies)
    bolted = np.isin(m.geom_bodyid, bolted_bodies)
    static = np.zeros(m.ngeom, bool)
    static[[m.geom(name).id for name in ("table", "floor")]] = True
    kind = np.full((m.ngeom, m.ngeom), IGNORED, np.int8)
    any_robot = robot[:, None] | robot[None, :]
    any_static = static[:, None] | static[None, :]
    kind[any_robot & ~any_static] = OTHER
    hand = np.isin(m.geom_bodyid, [b for b in range(m.nbody) if m.body(b).name in HAND_BODIES])
    kind[robot[:, None] & robot[None, :] & ~(hand[:, None] & hand[None, :])] = SELF
    pressing = (robot & ~bolted)[:, None] & static[None, :]
    kind[pressing | pressing.T] = TABLE
    return kind, robot


def _has_ancestor(model: mujoco.MjModel, body: int, ancestor: int) -> bool:
    while body != 0:
        if body == ancestor:
            return True
        body = model.body_parentid[body]
    return ancestor == 0


def rate_limited(values: np.ndarray, start: float, max_step: float) -> np.ndarray:
    """`values` followed from `start` moving at most `max_step` per sample."""
    out, current = [], float(start)
    for value in np.asarray(values, dtype=float).tolist():
        current = finger_toward(current, value, max_step)
        out.append(current)
    return np.array(out)
