"""The simulated UR5e: its MJCF kinematics are Universal Robots' standard DH table, and the
Simulator drives it through the same interfaces as the FR3."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest

from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.ur5e import flange_pose_in_base
from vla_runtime.sim.workcell import SceneConfig

# Published UR5e standard DH (FACTS.md), written out here so the test does not share code with
# the builder it checks.
A = [0.0, -0.425, -0.3922, 0.0, 0.0, 0.0]
D = [0.1625, 0.0, 0.0, 0.1333, 0.0997, 0.0996]
ALPHA = [math.pi / 2, 0.0, 0.0, math.pi / 2, -math.pi / 2, 0.0]
UR_JOINTS = [
    "shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint", "wrist_2_joint",
    "wrist_3_joint",
]  # fmt: skip
HOME = np.array([0.0, -math.pi / 2, math.pi / 2, -math.pi / 2, -math.pi / 2, 0.0])


def dh_flange(q) -> np.ndarray:
    pose = np.eye(4)
    for theta, a, d, alpha in zip(q, A, D, ALPHA, strict=True):
        ct, st, ca, sa = math.cos(theta), math.sin(theta), math.cos(alpha), math.sin(alpha)
        pose = pose @ np.array(
            [
                [ct, -st * ca, st * sa, a * ct],
                [st, ct * ca, -ct * sa, a * st],
                [0.0, sa, ca, d],
                [0.0, 0.0, 0.0, 1.0],
            ]
        )
    return pose


@pytest.fixture(scope="module")
def ur5e():
    model, _ = build_scene(SceneConfig(robot="ur5e", n_cubes=2))
    return model, mujoco.MjData(model)


def test_flange_matches_standard_dh_within_1mm_over_random_configurations(ur5e):
    model, data = ur5e
    assert [model.joint(i).name for i in range(6)] == UR_JOINTS
    rng = np.random.default_rng(7)
    lower, upper = model.jnt_range[:6, 0], model.jnt_range[:6, 1]
    for _ in range(200):
        q = rng.uniform(lower, upper)
        data.qpos[:6] = q
        mujoco.mj_kinematics(model, data)
        got, want = flange_pose_in_base(model, data), dh_flange(q)
        assert np.linalg.norm(got[:3, 3] - want[:3, 3]) < 1e-3, q
        assert np.abs(got[:3, :3] - want[:3, :3]).max() < 1e-3, q


def test_dh_reference_gives_the_published_home_reach():
    # Home: upper arm up, forearm horizontal, tool down; the flange sits a2 + a3 ... away.
    pose = dh_flange(HOME)
    np.testing.assert_allclose(pose[:3, 3], [-0.3922 - 0.0997, -0.1333, 0.1625 + 0.425 - 0.0996],
                               atol=1e-9)  # fmt: skip
    np.testing.assert_allclose(pose[:3, 2], [0.0, 0.0, -1.0], atol=1e-9)


def test_home_pose_reaches_over_the_table_with_the_tool_down(ur5e):
    model, data = ur5e
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    mujoco.mj_forward(model, data)
    flange = data.body("flange")
    assert flange.xpos[0] > 0.3 and flange.xpos[2] > 0.3  # in front of the base, above the table
    np.testing.assert_allclose(
        flange.xmat.reshape(3, 3)[:, 2], [0, 0, -1], atol=1e-4
    )  # keyframe text is rounded
    touching = {model.body(model.geom_bodyid[g]).name for c in data.contact for g in c.geom}
    assert touching <= {"world", "cube_red", "cube_green"}  # only the cubes rest on the table


def test_link_masses_are_the_published_ones(ur5e):
    model, _ = ur5e
    masses = [model.body(name).mass[0] for name in (
        "shoulder_link", "upper_arm_link", "forearm_link", "wrist_1_link", "wrist_2_link",
        "wrist_3_link",
    )]  # fmt: skip
    np.testing.assert_allclose(masses, [3.761, 8.058, 2.846, 1.37, 1.3, 0.365])


def test_simulator_holds_tracks_and_grips_like_the_fr3():
    from vla_runtime.sim.simulator import Simulator

    sim = Simulator(SceneConfig(robot="ur5e", n_cubes=0))
    assert sim.arm_joint_names == tuple(UR_JOINTS)
    sim.step(300)
    assert np.abs(sim.arm_positions - HOME).max() < 1e-6  # gravity compensated, no sag

    goal = HOME + np.array([0.4, 0.3, -0.3, 0.3, 0.3, -0.4])
    assert sim.set_trajectory(UR_JOINTS, [(HOME + goal) / 2, goal], [1.0, 2.0]) is None
    sim.step(2500)
    assert np.abs(sim.arm_positions - goal).max() < 1e-3

    assert sim.set_gripper(0.0) is None
    sim.step(1500)
    assert sim.gripper_width < 1e-3
    assert sim.set_gripper(0.04) is None
    sim.step(1500)
    assert abs(sim.gripper_width - 0.04) < 1e-3
    assert sim.set_gripper(0.2) is not None  # beyond the 85 mm stroke
