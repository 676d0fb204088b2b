"""Consequence rollout in the sim workcell: harmless motions pass, hazards are named."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest

from vla_runtime.core.kinematics import FRANKA, cartesian_path
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.workspace import Box, Workcell, box_planes
from vla_runtime.sim.consequence import BLOCK, ConsequenceChecker, ConsequenceConfig
from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.workcell import SceneConfig

ROBOT = load_robot("fr3")
HOME = np.array(ROBOT.home)
DT = 0.05
CUBE = np.array([0.55, 0.0, 0.02])  # the red cube is put here for the tests


@pytest.fixture(scope="module")
def scene():
    model, _ = build_scene(SceneConfig(n_cubes=2, cameras=()))
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    data.qpos[:7] = HOME
    red = model.joint("cube_red").qposadr[0]
    data.qpos[red : red + 7] = [*CUBE, 1.0, 0.0, 0.0, 0.0]
    green = model.joint("cube_green").qposadr[0]
    data.qpos[green : green + 7] = [0.4, 0.35, 0.02, 1.0, 0.0, 0.0, 0.0]
    return model, data.qpos.copy()


def rollout(scene, waypoints, steps=10, gripper=None, **config):
    model, qpos = scene
    checker = ConsequenceChecker(model, ROBOT, ConsequenceConfig(**config))
    path = cartesian_path(FRANKA, HOME, waypoints, steps)
    times = DT * np.arange(1, len(path) + 1)
    widths = None if gripper is None else np.full(len(path), gripper)
    return checker.rollout(qpos, np.zeros(7), times, path, widths)


def test_moving_above_the_cubes_is_safe(scene):
    result = rollout(scene, [CUBE + [0.0, 0.0, 0.15], CUBE + [-0.1, 0.1, 0.2]])
    assert result.safe, result.hazards
    assert result.numbers["max_contact_n"] < 1.0  # the hand's own finger contacts only
    assert result.numbers["max_object_shift_m"] < 1e-3


def test_reaching_down_beside_a_cube_is_safe(scene):
    beside = CUBE + [0.0, 0.12, 0.01]
    result = rollout(scene, [beside + [0, 0, 0.1], beside])
    assert result.safe, result.hazards


def test_driving_into_the_table_is_a_hazard(scene):
    spot = np.array([0.45, -0.2, 0.0])
    result = rollout(scene, [spot + [0, 0, 0.1], spot - [0, 0, 0.04]])
    assert any("presses the table" in h for h in result.hazards)
    assert result.numbers["max_table_contact_n"] > 10.0
    t = float(next(h for h in result.hazards if "presses the table" in h).rsplit("t=", 1)[1][:-2])
    assert result.first_hazard_s == pytest.approx(t, abs=0.006)  # the first seen, to a check
    safe = rollout(scene, [spot + [0, 0, 0.1]])
    assert safe.safe and safe.first_hazard_s is None


def test_a_press_the_arm_makes_after_the_last_point_is_the_chunks_hazard():
    # The last point leaves the TCP 6 mm above the table: the fingertips, 9 mm beyond it, end
    # in the table. A servo that lags its setpoint gets there after the chunk's last point,
    # while it settles.
    model, _ = build_scene(SceneConfig(n_cubes=0, cameras=(), servo_feedforward=False))
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    qpos = data.qpos.copy()
    spot = np.array([0.45, -0.2, 0.0])
    path = cartesian_path(FRANKA, HOME, [spot + [0, 0, 0.1], spot + [0, 0, 0.006]], 6)
    times = DT * np.arange(1, len(path) + 1)
    result = ConsequenceChecker(model, ROBOT, ConsequenceConfig()).rollout(
        qpos, np.zeros(7), times, path
    )
    assert any("presses the table" in h for h in result.hazards)
    assert result.first_hazard_s > times[-1]
    # Judged only 0.2 s past the last point, the same chunk looked harmless.
    short = ConsequenceChecker(model, ROBOT, ConsequenceConfig(settle_s=0.2))
    assert short.rollout(qpos, np.zeros(7), times, path).safe


def test_one_link_against_another_is_a_hazard_and_the_hand_closing_on_nothing_is_not(scene):
    model, qpos = scene
    folded = HOME.copy()
    folded[[1, 3, 5]] = 0.0, -2.93, 0.54  # the elbow folded until the hand meets link 1
    path = HOME + np.outer(np.arange(1, 17) / 16, folded - HOME)
    times = 0.1 * np.arange(1, 17)
    result = ConsequenceChecker(model, ROBOT, ConsequenceConfig()).rollout(
        qpos, np.zeros(7), times, path
    )
    assert any(h.startswith("collision with itself") for h in result.hazards), result.hazards
    # Far below what pushing a cube may press with: judged as an object contact, it passed.
    lenient = ConsequenceConfig(max_self_force=ConsequenceConfig.max_contact_force)
    assert ConsequenceChecker(model, ROBOT, lenient).rollout(qpos, np.zeros(7), times, path).safe
    # The hand closing on nothing is not a collision.
    closed = rollout(scene, [CUBE + [0.0, 0.0, 0.15]], gripper=0.0)
    assert closed.safe, closed.hazards


def test_sweeping_through_a_cube_pushes_it_and_can_push_it_off(scene):
    start = CUBE + [-0.12, 0.0, 0.01]
    path = [start + [0, 0, 0.1], start, CUBE + [0.1, 0.0, 0.01]]
    # The cube is shoved along, but stays on the table: a push, not a hazard by itself.
    result = rollout(scene, path, gripper=0.0)
    assert result.numbers["max_object_shift_m"] > 0.05
    assert not any("off the table" in h for h in result.hazards)
    # With the usable table ending just past the cube, the same push drops it off.
    edge = Box((-0.25, -0.8, -0.05), (CUBE[0] + 0.05, 0.8, 2.0), "short table")
    result = rollout(scene, path, gripper=0.0, object_region=edge)
    assert any("cube_red pushed off the table" in h for h in result.hazards)


def test_pushing_a_cube_into_a_keep_out_box_is_a_hazard(scene):
    start = CUBE + [-0.12, 0.0, 0.01]
    bin_box = Box((CUBE[0] + 0.04, -0.1, -0.01), (CUBE[0] + 0.3, 0.1, 0.1), "bin")
    result = rollout(
        scene, [start + [0, 0, 0.1], start, CUBE + [0.1, 0.0, 0.01]], gripper=0.0,
        workcell=Workcell(keep_out=(bin_box,)),
    )  # fmt: skip
    assert any("cube_red pushed into keep-out box bin" in h for h in result.hazards)


def test_leaving_the_workspace_is_a_hazard(scene):
    assert rollout(scene, [[0.3, 0.0, 0.7]]).safe  # the default ceiling is 1.2 m
    low_ceiling = box_planes((-0.25, -0.8, -0.05), (0.95, 0.8, 0.6))
    result = rollout(scene, [[0.3, 0.0, 0.7]], workcell=Workcell(workspace=low_ceiling))
    assert any("TCP leaves the workspace (z <= 0.6)" in h for h in result.hazards)


def table_press(model):
    """A chunk driving the hand 4 cm into the table (1 s), and a checker of its own."""
    spot = np.array([0.45, -0.2, 0.0])
    path = cartesian_path(FRANKA, HOME, [spot + [0, 0, 0.1], spot - [0, 0, 0.04]], 10)
    return ConsequenceChecker(model, ROBOT, ConsequenceConfig()), DT * np.arange(1, 21), path


def counting_steps(monkeypatch) -> list:
    steps = []
    step = mujoco.mj_step
    monkeypatch.setattr(mujoco, "mj_step", lambda m, d: (steps.append(1), step(m, d)))
    return steps


def test_a_rollout_stops_within_a_block_of_checks_after_its_first_hazard(scene):
    model, qpos = scene
    checker, times, path = table_press(model)
    result = checker.rollout(qpos, np.zeros(7), times, path)
    every = checker.config.check_every * checker.config.timestep
    assert 0.5 < result.first_hazard_s < times[-1]
    assert result.first_hazard_s <= checker.data.time <= result.first_hazard_s + BLOCK * every
    # The forces it judged are MuJoCo's own, contact by contact.
    forces = np.zeros(6)
    expected = []
    for i in range(checker.data.ncon):
        mujoco.mj_contactForce(checker.model, checker.data, i, forces)
        expected.append(abs(forces[0]))
    assert len(expected) > 0
    np.testing.assert_allclose(checker._normal_forces(), expected, rtol=1e-12, atol=1e-12)


def test_a_prefix_of_the_last_chunk_resumes_its_rollout_bit_for_bit(scene, monkeypatch):
    model, qpos = scene
    checker, times, path = table_press(model)
    full = checker.rollout(qpos, np.zeros(7), times, path)
    keep = int(np.count_nonzero(times < full.first_hazard_s - 0.1))  # as rollout_verdict cuts
    steps = counting_steps(monkeypatch)
    resumed = checker.rollout(qpos, np.zeros(7), times[:keep], path[:keep])
    fresh_checker = ConsequenceChecker(model, ROBOT, ConsequenceConfig())
    fresh = fresh_checker.rollout(qpos, np.zeros(7), times[:keep], path[:keep])
    # The fresh rollout's steps, less the checks before the prefix's last point.
    cfg = ConsequenceConfig()
    check_s = cfg.check_every * cfg.timestep
    skipped = cfg.check_every * (math.ceil(times[keep - 1] / check_s - 1e-9) - 1)
    n_steps = math.ceil((times[keep - 1] + cfg.settle_s) / cfg.timestep - 1e-9)
    assert len(steps) == 2 * n_steps - skipped
    assert (resumed.hazards, resumed.numbers) == (fresh.hazards, fresh.numbers)
    np.testing.assert_array_equal(checker.data.qpos, fresh_checker.data.qpos)
    np.testing.assert_array_equal(checker.data.qvel, fresh_checker.data.qvel)
    # From another arm velocity it is another simulation: no resuming.
    steps.clear()
    checker.rollout(qpos, np.full(7, 0.01), times[:keep], path[:keep])
    assert len(steps) == n_steps


def test_the_ur5e_workcell_is_judged_too():
    # Its base bodies and TCP have other names than the FR3's: the rollout finds them from the
    # arm's first joint and the scene's TCP site. Its base is turned half a turn in the scene,
    # and its workspace is given in the base frame, as the safety node's parameters are.
    ur5e = load_robot("ur5e")
    workcell = Workcell(workspace=box_planes(*ur5e.workspace))
    model, _ = build_scene(SceneConfig(robot="ur5e", n_cubes=0, cameras=()))
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    home = data.qpos[:6].copy()
    times = 0.1 * np.arange(1, 17)

    def lift_shoulder(delta):
        target = home + np.eye(6)[1] * delta
        path = home + np.outer(np.arange(1, 17) / 16, target - home)
        checker = ConsequenceChecker(model, ur5e, ConsequenceConfig(workcell=workcell))
        return checker.rollout(data.qpos.copy(), np.zeros(6), times, path)

    up = lift_shoulder(-1.2)
    assert up.safe, up.hazards
    down = lift_shoulder(1.2)
    assert any("presses the table" in h for h in down.hazards), down.hazards


def test_the_rollout_moves_the_arm_as_the_published_scene_says_its_servo_runs():
    # A scene built with the servo fed forward says so; the rollout then tracks the path as that
    # servo does, and sees the hand reach the table about the servo's 0.1 s lag sooner.
    spot = np.array([0.45, -0.2, 0.0])
    path = cartesian_path(FRANKA, HOME, [spot + [0, 0, 0.1], spot - [0, 0, 0.04]], 10)
    times = DT * np.arange(1, len(path) + 1)
    hazard_at = {}
    for fed in (False, True):
        model, _ = build_scene(SceneConfig(n_cubes=0, cameras=(), servo_feedforward=fed))
        data = mujoco.MjData(model)
        mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
        checker = ConsequenceChecker(model, ROBOT, ConsequenceConfig())
        result = checker.rollout(data.qpos.copy(), np.zeros(7), times, path)
        assert any("presses the table" in h for h in result.hazards), result.hazards
        hazard_at[fed] = result.first_hazard_s
    assert 0.05 < hazard_at[False] - hazard_at[True] < 0.2, hazard_at
