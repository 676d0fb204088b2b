"""The simulated hand grips like the real drivers' grasp: the cube is squeezed with the grasp
force per finger and stays in the hand while the arm lifts it, also when the hand is told a width
short of fully closed."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from vla_runtime.core.gripper import opening_from_width
from vla_runtime.data.experts import ArmKinematics, ScriptedExpert
from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.tasks import CONTROL_DT, HALF, MAX_STEPS, TaskSimulator
from vla_runtime.sim.workcell import GRASP_FORCE, GRIPPER_ACTUATOR, HAND_STIFFNESS, SceneConfig

PHYSICS_STEPS = round(CONTROL_DT / 0.001)


def _finger_squeeze(sim) -> float:
    """Mean normal force (N) of the finger contacts on the target cube, per finger."""
    model, data = sim.model, sim.data
    cube = model.geom(sim.setup.target_body).id
    force, total = np.zeros(6), 0.0
    for i in range(data.ncon):
        contact = data.contact[i]
        if cube not in (contact.geom1, contact.geom2):
            continue
        other = contact.geom2 if contact.geom1 == cube else contact.geom1
        if "finger" in model.body(model.geom_bodyid[other]).name:
            mujoco.mj_contactForce(model, data, i, force)
            total += abs(force[0])
    return total / 2


def _table_clearance(sim) -> float:
    """m between the table and the nearest collision geom of the hand and its fingers."""
    model, data = sim.model, sim.data
    table = model.geom("table").id
    hand = [g for g in range(model.ngeom)
            if (model.geom_contype[g] or model.geom_conaffinity[g])
            and ("finger" in model.body(model.geom_bodyid[g]).name
                 or model.body(model.geom_bodyid[g]).name == "hand")]  # fmt: skip
    assert hand
    fromto = np.zeros(6)
    return min(mujoco.mj_geomDistance(model, data, g, table, 0.5, fromto) for g in hand)


def _expert_steps(sim, steps: int, hold_width: float | None = None):
    """Drive `sim` with its task's scripted expert for `steps` control steps, yielding after
    each (`hold_width`: the hand's command from the pick's lift on)."""
    expert = ScriptedExpert(sim.setup, ArmKinematics(sim.model))
    names = [*sim.arm_joint_names, sim.robot.gripper_joints[0]]
    quat = slice(sim.model.joint(sim.setup.target_body).qposadr[0] + 3, None)
    for _ in range(steps):
        q, width = expert.act(sim.snapshot(), sim.arm_positions, sim.data.qpos[quat][:4])
        if hold_width is not None and expert.phase >= 3:
            width = hold_width
        assert sim.set_trajectory(names, [[*q, opening_from_width(width)]], [CONTROL_DT]) is None
        sim.step(PHYSICS_STEPS)
        yield


def _pick(hold_width: float, seed: int = 90001, clearances: list | None = None):
    """The pick expert, with `hold_width` commanded from the lift on; returns the simulator
    and the squeeze once lifted (`clearances`: gets the hand's clearance above the table at
    every step)."""
    sim = TaskSimulator("pick", seed=seed)
    squeeze = 0.0
    for _ in _expert_steps(sim, 200, hold_width):
        if clearances is not None:
            clearances.append(_table_clearance(sim))
        if sim.snapshot().cubes[sim.setup.target][2] > HALF + 0.02:
            squeeze = max(squeeze, _finger_squeeze(sim))
        if sim.success():
            break
    return sim, squeeze


def test_a_closed_hand_squeezes_with_the_grasp_force_and_lifts_the_cube():
    sim, squeeze = _pick(0.0)
    assert sim.success()
    assert 0.85 * GRASP_FORCE <= squeeze <= 1.05 * GRASP_FORCE


@pytest.mark.parametrize("seed", [90001, 90002])
def test_the_grasp_keeps_the_fingers_a_centimetre_above_the_table(seed):
    # A learned policy imitates the descent to a few mm: with the fingertips 4 mm above the
    # table its grasps pressed the table and were vetoed.
    clearances = []
    sim, _ = _pick(0.0, seed, clearances)
    assert sim.success()
    assert 0.008 <= min(clearances) <= 0.015


@pytest.mark.parametrize("task", ["push", "dynamic_reach"])
def test_pushing_and_touching_keep_the_fingers_a_centimetre_above_the_table(task):
    # As for the grasp: a policy imitating the expert's height a few mm low must not press the
    # table (the push's closed fingertips were 9 mm above it, and pushing policies pressed it);
    # the touch goes down to the sliding cube's centre height, no closer than that either.
    sim = TaskSimulator(task, seed=90003, servo_feedforward=True)
    clearances, touched = [], 0
    for _ in _expert_steps(sim, MAX_STEPS[task]):  # past the success, as recorded episodes go
        clearances.append(_table_clearance(sim))
        touched += sim.success()
    assert touched
    assert 0.010 <= min(clearances) <= 0.02


def test_a_hand_told_three_centimetres_still_holds_a_four_centimetre_cube():
    sim, squeeze = _pick(0.03)
    assert sim.success()
    # The servo's spring on the 5 mm shortfall of the opening, shared by the two fingers; a 50 g
    # cube needs about 0.25 N per finger at friction 1.
    assert squeeze == pytest.approx(HAND_STIFFNESS * opening_from_width(0.04 - 0.03) / 2, rel=0.15)


@pytest.mark.parametrize("robot", ["fr3", "ur5e"])
def test_every_hand_caps_its_force_at_the_grasp_force(robot):
    model, _ = build_scene(SceneConfig(robot=robot, n_cubes=0, cameras=()))
    hand = model.actuator(GRIPPER_ACTUATOR).id
    assert model.actuator_forcerange[hand].tolist() == [-2 * GRASP_FORCE, 2 * GRASP_FORCE]
