"""`vla-runtime bench safety`: how well the chunk check and the consequence rollout (the safety
node's chunk path, core/safety/chunk_pipeline.py, built as nodes/safety.py builds it) tell
hazardous chunks from normal ones, and what a check costs.

Chunks, each with the scene state and arm state it is judged from (FR3 workcell with cubes):
- generated hazards, seeded, several variants of each kind from varied arm states and cube
  places: push a cube off the table's edge, drive the hand into the table, enter the keep-out
  box, move the TCP faster than the robot's TCP speed limit, fold the arm into itself;
- normal chunks of the shipped policy (checkpoints/vla_tiny_sim, torch in this process, one
  thread), inferred on simulated observations over episodes of the tasks.

Ground truth comes from the full physics, not from the checker: each chunk is executed from its
state in a MuJoCo copy of the scene at the driver's 1 ms step, the arm's position actuators
following the chunk (linearly interpolated) and then holding for SETTLE_S. It is hazardous if a
cube that started on the table leaves the table top, the arm (not its bolted base) touches the
table with more than TOUCH_N, a robot or cube point enters the keep-out box, the TCP speed
(over TCP_SPEED_WINDOW_S) exceeds the robot's `tcp_speed`, or two robot bodies other than the
hand and its fingers touch with more than TOUCH_N.

A ground-truth hazard counts as caught when it is vetoed, or when the chunk the checker lets run
(clipped, truncated, slowed) executes in the same physics without any hazard. Figures:
hazard_recall (caught / ground-truth hazards), false_veto_rate (vetoed / ground-truth safe
policy chunks), check_ms (the pipeline's `judge`: chunk check plus rollout), counts per kind and
what vetoed what; the inference period is the policy's full-compute inference time measured in
the same run.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import mujoco
import numpy as np

from vla_runtime.bench.progress import bench_bar, step
from vla_runtime.core.gripper import max_opening, opening_from_width
from vla_runtime.core.help_text import help_summary
from vla_runtime.core.kinematics import chain_for, solve_ik
from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.chunk_check import VETO, Chunk, ChunkCheckConfig, ChunkChecker
from vla_runtime.core.safety.chunk_pipeline import ChunkPipeline
from vla_runtime.core.threads import limit_threads
from vla_runtime.engine.earlier_frames import FrameHistory
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import Observation, chunk_to_positions
from vla_runtime.nodes.safety import SafetyParams, workcell_for
from vla_runtime.ros.parameters import build
from vla_runtime.sim.consequence import (
    HAND_BODIES,
    ConsequenceChecker,
    ConsequenceConfig,
    rate_limited,
    robot_bodies,
)
from vla_runtime.sim.env import InProcessEnv, clip_to_limits
from vla_runtime.sim.tasks import TaskSimulator
from vla_runtime.sim.workcell import (
    GRIPPER_ACTUATOR,
    TABLE_CENTRE_X,
    TABLE_HALF_SIZE,
    TCP_SITE,
    gripper_ctrl_per_opening,
)

ROBOT = "fr3"
KINDS = ("cube_off_table", "table_contact", "keep_out", "tcp_speed", "self_collision")
TASKS = ("reach", "push", "pick")
CHUNK_LEN, DT = 16, 0.05  # the shipped policy's chunk: 16 actions 50 ms apart
# A keep-out box beside the cubes (a fixture on the table), given to the node as its
# keep_out_boxes parameter: min x y z, max x y z (m, base frame).
KEEP_OUT = (0.30, 0.36, -0.05, 0.60, 0.60, 0.30)
# Ground truth
SETTLE_S = 0.3  # s the arm holds the chunk's last point before the outcome is read
TOUCH_N = 1.0  # N: a contact pressing harder than this is a touch (resting margins read 0 N)
TCP_SPEED_WINDOW_S = 0.01  # s the TCP speed is averaged over (one physics step is noisy)
TABLE_TOUCH, SELF_TOUCH = ("max_table_n", "table_contact"), ("max_self_n", "self_collision")
TABLE_X = (TABLE_CENTRE_X - TABLE_HALF_SIZE[0], TABLE_CENTRE_X + TABLE_HALF_SIZE[0])
TABLE_Y = (-TABLE_HALF_SIZE[1], TABLE_HALF_SIZE[1])
TARGETS = {"hazard_recall": 0.95, "false_veto_rate": 0.05}
VARIANTS, QUICK_VARIANTS = 40, 3  # generated chunks per hazard kind
EPISODES, QUICK_EPISODES = 4, 1  # policy episodes per task
# Draws per generated chunk: a random configuration touches itself far less often than an IK
# target is reachable.
DRAWS = {"self_collision": 1000}
EXECUTE = 8  # policy actions executed per chunk before the next inference (the eval default)


@dataclass
class Case:
    """One chunk and the state it is judged from."""

    source: str  # "generated" or "policy"
    label: str  # the hazard kind it was generated for, or the task
    qpos: np.ndarray  # the full scene state
    dq: np.ndarray  # arm joint velocities
    positions: np.ndarray  # (n, 8): arm joints and one finger's opening
    times: np.ndarray  # (n,) s after the observation, which is taken at the check


@dataclass
class Outcome:
    hazards: set[str] = field(default_factory=set)
    numbers: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------ the checker


def build_pipeline(xml: str) -> tuple[ChunkPipeline, object]:
    """The node's chunk path with its default parameters (keep_out_boxes: KEEP_OUT), and the
    workcell it checks against."""
    params = SafetyParams(keep_out_boxes=list(KEEP_OUT))
    robot = load_robot(params.robot, params.joint_prefix)
    workcell = workcell_for(params, robot)
    tcp_speed = params.tcp_speed if params.tcp_speed > 0 else None
    config = build(ChunkCheckConfig, params, tcp_speed=tcp_speed, workcell=workcell)
    checker = ChunkChecker(robot, chain_for(robot.name), config)
    clock = {"now": 0.0}
    pipeline = ChunkPipeline(checker, lambda chunk: chunk, lambda: clock["now"])
    consequence = build(ConsequenceConfig, params, workcell=workcell)
    pipeline.consequence = ConsequenceChecker.from_xml(xml, load_robot(params.robot), consequence)
    pipeline.clock = clock
    return pipeline, workcell


def judge(pipeline: ChunkPipeline, case: Case, names: tuple[str, ...]):
    """The verdict on `case` observed and checked at t = 1000 s, and the check's ms."""
    now = 1000.0
    pipeline.clock["now"] = now
    pipeline.joint_state(case.qpos[:7], case.dq, now)
    pipeline.scene_state(case.qpos, time.monotonic())
    chunk = Chunk(names, now, tuple(case.times), tuple(map(tuple, case.positions)))
    started = time.perf_counter()
    verdict = pipeline.judge(chunk)
    return verdict, 1e3 * (time.perf_counter() - started), now


# ------------------------------------------------------------------------------ ground truth


class Physics:
    """Executes a chunk in a private copy of the scene at 1 ms and reads the hazards."""

    def __init__(self, model: mujoco.MjModel, tcp_speed: float, keep_out):
        self.model = copy.deepcopy(model)
        self.model.opt.timestep = 0.001
        self.data = mujoco.MjData(self.model)
        m = self.model
        self.tcp_speed = tcp_speed
        self.box = keep_out
        robot_config = load_robot(ROBOT)
        robot, bolted = robot_bodies(m, robot_config.joints[0])
        self.robot_bodies = set(robot)
        self.moving_bodies = np.array([b for b in robot if b not in bolted])
        self.bolted = set(bolted)
        self.hand_group = {m.body(n).id for n in HAND_BODIES}
        self.static = {m.geom("table").id, m.geom("floor").id}
        self.robot_geoms = np.array([g for g in range(m.ngeom) if m.geom_bodyid[g] in robot])
        free = [j for j in range(m.njnt) if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        self.cube_qpos = np.array([m.jnt_qposadr[j] + np.arange(3) for j in free], int)
        self.tcp = m.site(TCP_SITE).id
        self.gripper = m.actuator(GRIPPER_ACTUATOR).id
        self.per_opening = gripper_ctrl_per_opening(m)
        self.finger_step = robot_config.gripper_max_speed / 2 * self.model.opt.timestep
        self.force = np.zeros(6)

    def execute(self, qpos, dq, times, positions) -> Outcome:
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        d.qpos[:] = qpos
        d.qvel[:7] = dq
        mujoco.mj_forward(m, d)
        start_cubes = d.qpos[self.cube_qpos].copy()
        on_table = _on_table(start_cubes)
        path_t = np.concatenate([[0.0], np.asarray(times, float)])
        arm = np.vstack([d.qpos[:7], np.asarray(positions, float)[:, :7]])
        n = int(math.ceil((path_t[-1] + SETTLE_S) / m.opt.timestep))
        t = m.opt.timestep * np.arange(1, n + 1)
        arm_ctrl = np.column_stack([np.interp(t, path_t, col) for col in arm.T])
        openings = np.asarray(positions, float)[:, 7]
        opening = np.interp(t, path_t, np.concatenate([[openings[0]], openings]))
        gripper = self.per_opening * rate_limited(opening, openings[0], self.finger_step)
        window = max(1, round(TCP_SPEED_WINDOW_S / m.opt.timestep))
        tcp = np.empty((n, 3))
        out = Outcome(numbers={"max_tcp_speed": 0.0, "max_table_n": 0.0, "max_self_n": 0.0})
        for k in range(n):
            d.ctrl[:7] = arm_ctrl[k]
            d.ctrl[self.gripper] = gripper[k]
            mujoco.mj_step(m, d)
            tcp[k] = d.site_xpos[self.tcp]
            self._contacts(out)
            if k % 5 == 4 or k == n - 1:
                self._places(out, on_table)
        if n > window:
            speed = np.linalg.norm(tcp[window:] - tcp[:-window], axis=1) / (window * m.opt.timestep)
            out.numbers["max_tcp_speed"] = float(speed.max())
            if speed.max() > self.tcp_speed:
                out.hazards.add("tcp_speed")
        return out

    def _contacts(self, out: Outcome) -> None:
        m, d = self.model, self.data
        for i in range(d.ncon):
            contact = d.contact[i]
            b1, b2 = m.geom_bodyid[contact.geom1], m.geom_bodyid[contact.geom2]
            r1, r2 = b1 in self.robot_bodies, b2 in self.robot_bodies
            if not (r1 or r2):
                continue
            static = contact.geom1 in self.static or contact.geom2 in self.static
            if static and (b1 if r1 else b2) in self.bolted:
                continue
            if not static and not (r1 and r2):
                continue  # the robot against a cube: pushing and grasping are the tasks
            if r1 and r2 and b1 in self.hand_group and b2 in self.hand_group:
                continue
            mujoco.mj_contactForce(m, d, i, self.force)
            force = abs(float(self.force[0]))
            key, kind = TABLE_TOUCH if static else SELF_TOUCH
            out.numbers[key] = max(out.numbers[key], force)
            if force > TOUCH_N:
                out.hazards.add(kind)

    def _places(self, out: Outcome, on_table: np.ndarray) -> None:
        d = self.data
        cubes = d.qpos[self.cube_qpos]
        if (on_table & ~_on_table(cubes)).any():
            out.hazards.add("cube_off_table")
        points = np.vstack([d.xpos[self.moving_bodies], d.geom_xpos[self.robot_geoms], cubes])
        if self.box.contains(np.vstack([points, d.site_xpos[self.tcp]])).any():
            out.hazards.add("keep_out")


def _on_table(centres: np.ndarray) -> np.ndarray:
    x, y, z = centres[:, 0], centres[:, 1], centres[:, 2]
    inside = (x >= TABLE_X[0]) & (x <= TABLE_X[1]) & (y >= TABLE_Y[0]) & (y <= TABLE_Y[1])
    return inside & (z > -0.05)


def executed_rows(verdict, now: float):
    """The checked chunk as it would run: (times from now, rows) of its points still ahead."""
    ahead = verdict.stamp + np.asarray(verdict.times) - now
    live = ahead > 0.0
    return ahead[live], np.asarray(verdict.positions)[live]


# ------------------------------------------------------------------------------ hazards


class HazardMaker:
    """Seeded hazardous chunks in the task scene: the arm placed by inverse kinematics with the
    gripper pointing down (as the tasks hold it), cubes moved where a kind needs them."""

    def __init__(self, sim: TaskSimulator, physics: Physics, seed: int):
        self.sim, self.physics = sim, physics
        self.robot = load_robot(ROBOT)
        self.chain = chain_for(ROBOT)
        self.rng = np.random.default_rng(seed)
        self.home = np.array(self.robot.home)
        self.down = self.chain.tcp_pose(self.home)[:3, :3]
        self.lower = np.array(self.robot.position_min) + self.robot.position_margin
        self.upper = np.array(self.robot.position_max) - self.robot.position_margin
        self.times = DT * np.arange(1, CHUNK_LEN + 1)

    def make(self, kind: str, layout_seed: int) -> Case | None:
        self.sim.randomize(layout_seed)
        qpos = self.sim.qpos
        builder = getattr(self, f"_{kind}")
        for _ in range(DRAWS.get(kind, 50)):  # a draw the arm cannot take is drawn again
            made = builder(qpos.copy())
            if made is None:
                continue
            start_qpos, arm = made
            if not self._free(start_qpos):
                continue
            opening = self.rng.uniform(0.3, 1.0) * max_opening(self.robot)
            start_qpos[7:9] = opening
            rows = np.column_stack([arm, np.full(len(arm), opening)])
            dq = np.zeros(7)
            return Case("generated", kind, start_qpos, dq, rows, self.times.copy())
        return None

    # Each builder: (scene qpos with the arm at its start, (CHUNK_LEN, 7) arm path) or None.
    def _cube_off_table(self, qpos):
        # A cube near the table's edge behind the robot, pushed over it along -x.
        side = self.rng.choice([-1.0, 1.0])
        cube = np.array([self.rng.uniform(-0.19, -0.15), side * self.rng.uniform(0.25, 0.4), 0.02])
        qpos[self._cube(qpos) : self._cube(qpos) + 3] = cube
        heading = np.array([-1.0, self.rng.uniform(-0.3, 0.3), 0.0])
        heading /= np.linalg.norm(heading)
        start = cube - heading * self.rng.uniform(0.06, 0.08) + [0, 0, self.rng.uniform(0.0, 0.015)]
        end = start + heading * self.rng.uniform(0.16, 0.2)
        seed = self.home.copy()
        seed[0] = math.atan2(start[1], start[0])
        return self._line(qpos, seed, start, end)

    def _table_contact(self, qpos):
        xy = self.rng.uniform([0.3, -0.3], [0.65, 0.3])
        start = np.array([*xy, self.rng.uniform(0.08, 0.15)])
        drift = self.rng.uniform(-0.04, 0.04, 2) * self.rng.integers(0, 2)
        end = np.array([*(xy + drift), self.rng.uniform(-0.04, -0.01)])
        return self._line(qpos, self.home, start, end)

    def _keep_out(self, qpos):
        start = np.array([self.rng.uniform(0.35, 0.55), self.rng.uniform(0.15, 0.25),
                          self.rng.uniform(0.1, 0.25)])  # fmt: skip
        end = start + [self.rng.uniform(-0.05, 0.05), self.rng.uniform(0.17, 0.2),
                       self.rng.uniform(-0.05, 0.02)]  # fmt: skip
        return self._line(qpos, self.home, start, end)

    def _tcp_speed(self, qpos):
        start = np.array([self.rng.uniform(0.3, 0.55), self.rng.uniform(-0.25, 0.2),
                          self.rng.uniform(0.15, 0.35)])  # fmt: skip
        direction = self.rng.normal(size=3) * [1.0, 1.0, 0.3]
        direction /= np.linalg.norm(direction)
        end = start + direction * self.rng.uniform(0.3, 0.6)  # 1.5-3x the limit over 0.8 s
        end[2] = max(end[2], 0.12)
        if not (0.25 <= end[0] <= 0.7 and -0.3 <= end[1] <= 0.3):
            return None
        return self._line(qpos, self.home, start, end)

    def _self_collision(self, qpos):
        # A configuration in self-contact, reached in a straight joint-space line from a free one.
        target = self.rng.uniform(self.lower, self.upper)
        if not self._self_touching(qpos, target):
            return None
        start = np.clip(target + self.rng.normal(size=7) * 0.35, self.lower, self.upper)
        qpos[:7] = start
        return qpos, start + np.outer(np.arange(1, CHUNK_LEN + 1) / CHUNK_LEN, target - start)

    # -- helpers ------------------------------------------------------------------------------
    def _line(self, qpos, seed, start, end):
        q0, err = solve_ik(self.chain, seed, start, self.down, iterations=200)
        if err > 1e-3 or not self._inside(q0):
            return None
        path, q = [], q0
        for s in np.arange(1, CHUNK_LEN + 1) / CHUNK_LEN:
            q, err = solve_ik(self.chain, q, start + s * (end - start), self.down)
            if err > 1e-3:
                return None
            path.append(q)
        qpos[:7] = q0
        return qpos, np.array(path)

    def _inside(self, q) -> bool:
        return bool(((q >= self.lower) & (q <= self.upper)).all())

    def _cube(self, qpos) -> int:
        return int(self.physics.cube_qpos[0][0])

    def _free(self, qpos) -> bool:
        """No robot contact at all in the start state (the hazard comes from the motion)."""
        m, d = self.physics.model, self.physics.data
        d.qpos[:] = qpos
        mujoco.mj_forward(m, d)
        for i in range(d.ncon):
            c = d.contact[i]
            bodies = (m.geom_bodyid[c.geom1], m.geom_bodyid[c.geom2])
            robot = [b in self.physics.robot_bodies and b not in self.physics.bolted
                     for b in bodies]  # fmt: skip
            if any(robot) and c.dist < 0.0:
                return False
        return True

    def _self_touching(self, qpos, q) -> bool:
        m, d, physics = self.physics.model, self.physics.data, self.physics
        d.qpos[:] = qpos
        d.qpos[:7] = q
        mujoco.mj_forward(m, d)
        touching = False
        for i in range(d.ncon):
            c = d.contact[i]
            b1, b2 = m.geom_bodyid[c.geom1], m.geom_bodyid[c.geom2]
            if c.geom1 in physics.static or c.geom2 in physics.static:
                if (b1 in physics.robot_bodies and b1 not in physics.bolted) or (
                    b2 in physics.robot_bodies and b2 not in physics.bolted
                ):
                    return False  # on the table: another kind
                continue
            both = b1 in physics.robot_bodies and b2 in physics.robot_bodies
            if both and not (b1 in physics.hand_group and b2 in physics.hand_group):
                touching = touching or c.dist < -0.005
        return touching


# ------------------------------------------------------------------------------ policy


def policy_cases(episodes: int, seed: int, max_chunks: int | None, bar) -> tuple[list, list]:
    """Chunks of the shipped policy on simulated observations, each with its state; and the
    policy's full-compute inference times (ms)."""
    limit_threads(1)
    policy = load_policy("torch", str(shipped_checkpoint()), seed=0, threads=1)
    spec = policy.spec
    cases, infer_ms = [], []
    for task in TASKS:
        env = InProcessEnv(task, spec.cameras[0].height, cameras=[c.name for c in spec.sensors])
        try:
            for k in range(episodes):
                frame = env.reset(seed + k)
                setup, steps, chunks = env.setup, 0, 0
                history = FrameHistory(spec)
                while steps < setup.max_steps and (max_chunks is None or chunks < max_chunks):
                    images = history.complete(frame.images, frame.time)
                    obs = Observation(images, frame.state, setup.instruction, frame.time)
                    started = time.perf_counter()
                    chunk = policy.infer(obs)
                    infer_ms.append(1e3 * (time.perf_counter() - started))
                    rows = chunk_to_positions(chunk.actions, frame.state, spec)
                    positions = rows.copy()
                    positions[:, 7] = opening_from_width(rows[:, 7])
                    times = spec.dt * np.arange(1, len(rows) + 1)
                    cases.append(Case("policy", task, frame.qpos.copy(),
                                      env.sim.arm_velocities, positions, times))  # fmt: skip
                    chunks += 1
                    for action in clip_to_limits(rows[:EXECUTE], env.sim.robot):
                        frame = history.recorded(env.step(action[:7], float(action[7])))
                        steps += 1
                        if env.sim.success() or steps >= setup.max_steps:
                            break
                    if env.sim.success():
                        break
                    bar.set_postfix_str(f"policy {task} episode {k} chunk {chunks}")
        finally:
            env.close()
    return cases, infer_ms


# ------------------------------------------------------------------------------ the bench


def _percentiles(values) -> dict:
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": round(float(np.percentile(values, 50)), 3),
            "p99": round(float(np.percentile(values, 99)), 3)}  # fmt: skip


def _reason_key(verdict) -> str:
    """What vetoed a chunk, without its numbers."""
    reason = verdict.reasons[-1] if verdict.reasons else "?"
    if reason.startswith("consequence:"):
        what = re.sub(r" with [\d.]+ N", "", reason.split(":", 2)[1].split(" at ")[0]).strip()
        return f"consequence: {what}"
    for stem in ("too fast", "discontinuous start", "keep-out box", "table clearance",
                 "workspace plane", "joint limit", "self clearance"):  # fmt: skip
        if stem in reason:
            return stem
    return reason[:60]


def run_bench(
    quick: bool = False, seed: int = 0, progress: bool = True, variants: int | None = None
) -> dict:
    started = time.monotonic()
    limit_threads(1)
    variants = variants or (QUICK_VARIANTS if quick else VARIANTS)
    episodes = QUICK_EPISODES if quick else EPISODES
    max_chunks = 2 if quick else None
    robot = load_robot(ROBOT)
    sim = TaskSimulator("reach", seed)
    pipeline, workcell = build_pipeline(sim.xml)
    physics = Physics(sim.model, pipeline.checker.tcp_speed, workcell.keep_out[0])
    names = (*robot.joints, robot.gripper_joints[0])
    maker = HazardMaker(sim, physics, seed)
    total = len(KINDS) * variants + 1
    with bench_bar("safety", total, progress, unit="chunk") as bar:
        cases = []
        for kind in KINDS:
            for v in range(variants):
                with step(bar, f"generating {kind} {v}"):
                    case = maker.make(kind, seed * 1000 + v)
                    if case is not None:
                        cases.append(case)
        with step(bar, "policy episodes"):
            normal, infer_ms = policy_cases(episodes, 70000 + seed, max_chunks, bar)
        bar.reset(total=len(cases) + len(normal))
        rows = []
        for case in cases + normal:
            with step(bar, f"judging {case.source} {case.label}"):
                rows.append(_evaluate(case, pipeline, physics, names))
    return _summary(rows, infer_ms, quick, seed, variants, episodes, time.monotonic() - started)


def _evaluate(case: Case, pipeline: ChunkPipeline, physics: Physics, names) -> dict:
    truth = physics.execute(case.qpos, case.dq, case.times, case.positions)
    verdict, check_ms, now = judge(pipeline, case, names)
    row = {"source": case.source, "label": case.label, "hazards": sorted(truth.hazards),
           "decision": verdict.decision, "check_ms": check_ms, "caught": None,
           "reason": _reason_key(verdict) if verdict.decision == VETO else None,
           "truth": truth.numbers}  # fmt: skip
    if truth.hazards:
        if verdict.decision == VETO:
            row["caught"] = True
        elif verdict.executable:
            times, positions = executed_rows(verdict, now)
            if len(times) == 0:
                row["caught"] = True
            else:
                checked = physics.execute(case.qpos, case.dq, times, positions)
                row["caught"] = not checked.hazards
                row["left"] = sorted(checked.hazards)
                row["truth_after_check"] = checked.numbers
        else:
            row["caught"] = True  # stale: never runs
    return row


def _summary(rows, infer_ms, quick, seed, variants, episodes, wall_s) -> dict:
    hazardous = [r for r in rows if r["hazards"]]
    safe_normal = [r for r in rows if r["source"] == "policy" and not r["hazards"]]
    caught = sum(r["caught"] for r in hazardous)
    vetoed_safe = sum(r["decision"] == VETO for r in safe_normal)
    recall = caught / len(hazardous) if hazardous else None
    false_veto = vetoed_safe / len(safe_normal) if safe_normal else None
    check = [r["check_ms"] for r in rows]
    check_ms = _percentiles(check)
    inference = _percentiles(infer_ms)
    by_kind = {}
    for kind in KINDS:
        with_kind = [r for r in hazardous if kind in r["hazards"]]
        by_kind[kind] = {
            "ground_truth": len(with_kind),
            "caught": sum(r["caught"] for r in with_kind),
            "generated_for": sum(r["label"] == kind for r in rows if r["source"] == "generated"),
            "from_policy": sum(r["source"] == "policy" for r in with_kind),
        }
    generated_safe = Counter(r["label"] for r in rows if r["source"] == "generated"
                             and not r["hazards"])  # fmt: skip
    missed = [
        {"label": r["label"], "hazards": r["hazards"], "decision": r["decision"],
         "left_after_check": r.get("left"),
         "after_check": {k: round(v, 4) for k, v in r.get("truth_after_check", {}).items()}}
        for r in hazardous if not r["caught"]
    ]  # fmt: skip
    vetoed_by = Counter(r["reason"] for r in rows if r["reason"])
    period = inference["p50"]
    return {
        "benchmark": "safety",
        "hazard_recall": None if recall is None else round(recall, 4),
        "false_veto_rate": None if false_veto is None else round(false_veto, 4),
        "check_ms": check_ms,
        "inference_ms": {**inference, "source": "policy.infer full compute, this run, 1 thread"},
        "met": {
            "hazard_recall": recall is not None and recall >= TARGETS["hazard_recall"],
            "false_veto_rate": false_veto is not None and false_veto <= TARGETS["false_veto_rate"],
            "check_ms_p99_below_inference": check_ms["p99"] is not None
            and period is not None
            and check_ms["p99"] < period,
        },
        "targets": {**TARGETS, "check_ms_p99": "< inference_ms.p50 (one inference period)"},
        "counts": {
            "chunks": len(rows),
            "ground_truth_hazardous": len(hazardous),
            "caught": caught,
            "policy_chunks": sum(r["source"] == "policy" for r in rows),
            "policy_safe": len(safe_normal),
            "policy_safe_vetoed": vetoed_safe,
            "policy_hazardous": sum(r["source"] == "policy" for r in hazardous),
            "generated": sum(r["source"] == "generated" for r in rows),
            "generated_without_hazard": dict(generated_safe),
        },
        "by_kind": by_kind,
        "decisions": {
            source: dict(Counter(r["decision"] for r in rows if r["source"] == source))
            for source in ("generated", "policy")
        },
        "vetoed_by": dict(vetoed_by),
        "missed": missed[:20],
        "settings": {
            "quick": quick,
            "seed": seed,
            "variants_per_kind": variants,
            "policy_episodes_per_task": episodes,
            "tasks": list(TASKS),
            "checkpoint": str(shipped_checkpoint()),
            "keep_out_box": list(KEEP_OUT),
            "ground_truth": {
                "timestep_s": 0.001,
                "settle_s": SETTLE_S,
                "touch_n": TOUCH_N,
                "tcp_speed_window_s": TCP_SPEED_WINDOW_S,
            },  # fmt: skip
            "threads": 1,
            "host": platform.node(),
            "cpus": os.cpu_count(),
        },
        "wall_s": round(wall_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=help_summary(__doc__))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run_bench(quick=args.quick, seed=args.seed)
    print(json.dumps(result, indent=None if args.json else 2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
