"""Forward kinematics against the MuJoCo FR3 model (franky-sim MJCF) and hand-derived UR poses
from Universal Robots' published DH tables."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest

from vla_runtime.core.kinematics import FRANKA, UR5E, chain_for, tcp_speeds
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.command_geometry import ChainPoints
from vla_runtime.sim.scene import franky_fr3_assets

TCP_BEYOND_HAND = 0.1034


@pytest.fixture(scope="module")
def fr3_model():
    spec = mujoco.MjSpec.from_file(str(franky_fr3_assets() / "fr3.xml"))
    spec.meshdir = str(franky_fr3_assets() / "meshes")
    model = spec.compile()
    return model, mujoco.MjData(model)


def random_configurations(robot: str, n: int, seed: int) -> np.ndarray:
    limits = load_robot(robot)
    rng = np.random.default_rng(seed)
    return rng.uniform(limits.position_min, limits.position_max, size=(n, limits.dof))


def test_fr3_flange_and_tcp_match_mujoco_within_1mm(fr3_model):
    model, data = fr3_model
    hand = model.body("hand").id
    qs = random_configurations("fr3", 200, seed=1)
    flange = FRANKA.flange_position(qs)
    tcp = FRANKA.tcp_position(qs)
    poses = FRANKA.tcp_pose(qs)
    for q, f, t, pose in zip(qs, flange, tcp, poses, strict=True):
        data.qpos[:7] = q
        mujoco.mj_kinematics(model, data)
        hand_pos = data.xpos[hand]
        hand_rot = data.xmat[hand].reshape(3, 3)
        assert np.linalg.norm(f - hand_pos) < 1e-3
        assert np.linalg.norm(t - (hand_pos + TCP_BEYOND_HAND * hand_rot[:, 2])) < 1e-3
        # The hand frame (rotated -45 deg about the flange) is the TCP orientation.
        assert np.abs(pose[:3, :3] - hand_rot).max() < 1e-6


def hand_collision_points(model, data) -> np.ndarray:
    """Every vertex of the hand's and fingers' collision geoms (meshes, boxes), base frame."""
    bodies = {model.body(name).id for name in ("hand", "left_finger", "right_finger")}
    corners = np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1).T
    out = []
    for g in range(model.ngeom):
        if model.geom_bodyid[g] not in bodies or not model.geom_contype[g]:
            continue
        if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH:
            mesh = model.geom_dataid[g]
            start = model.mesh_vertadr[mesh]
            local = model.mesh_vert[start : start + model.mesh_vertnum[mesh]]
        else:
            assert model.geom_type[g] == mujoco.mjtGeom.mjGEOM_BOX
            local = corners * model.geom_size[g]
        out.append(local @ data.geom_xmat[g].reshape(3, 3).T + data.geom_xpos[g])
    return np.vstack(out)


def test_fr3_hand_outline_reaches_as_low_as_the_hands_collision_geometry(fr3_model):
    model, data = fr3_model
    rng = np.random.default_rng(5)
    qs = random_configurations("fr3", 300, seed=5)
    home = np.array(load_robot("fr3").home)
    down = np.tile(home, (50, 1))  # the hand pointing straight down, turned about its axis
    down[:, 6] = rng.uniform(-2.9, 2.9, 50)
    _, outlines = ChainPoints(FRANKA).frames(np.vstack([qs, down]))
    gaps = []
    for q, outline in zip(np.vstack([qs, down]), outlines, strict=True):
        data.qpos[:7] = q
        data.qpos[7:9] = rng.uniform(0.0, FRANKA.hand.stroke)  # either opening: the whole stroke
        mujoco.mj_kinematics(model, data)
        gaps.append(hand_collision_points(model, data)[:, 2].min() - outline[:, 2].min())
    gaps = np.array(gaps)
    # Never above the real lowest point; below it by the boxes' corners (up to 3 cm for a hand
    # on its side), by under 0.5 mm pointing down, where the fingertips are 9 mm past the TCP.
    assert gaps.min() >= -1e-4
    assert gaps.max() < 0.035
    assert gaps[len(qs) :].max() < 5e-4
    data.qpos[:7] = home
    mujoco.mj_kinematics(model, data)
    tcp_z = FRANKA.tcp_position(home)[2]
    assert tcp_z - hand_collision_points(model, data)[:, 2].min() == pytest.approx(0.0089, abs=2e-4)


def test_fr3_joint_origins_match_mujoco_link_bodies(fr3_model):
    model, data = fr3_model
    q = random_configurations("fr3", 1, seed=2)[0]
    data.qpos[:7] = q
    mujoco.mj_kinematics(model, data)
    points = FRANKA.points(q)
    # Modified DH puts frame i at body fr3_link<i>'s origin.
    for i in range(7):
        assert np.linalg.norm(points[i] - data.xpos[model.body(f"fr3_link{i + 1}").id]) < 1e-6


def test_franka_home_tcp_is_the_known_ready_pose():
    # Franka's "ready" pose puts the hand TCP 0.307 m ahead of the base at 0.487 m height.
    tcp = FRANKA.tcp_position(load_robot("fr3").home)
    np.testing.assert_allclose(tcp, [0.307, 0.0, 0.487], atol=5e-4)


def test_ur5e_zero_pose_is_the_stretched_arm():
    # q = 0: links 2 and 3 lie along -x, wrist offsets d4 and d6 go along -y, d5 down.
    np.testing.assert_allclose(
        UR5E.tcp_position(np.zeros(6)), [-0.425 - 0.3922, -0.1333 - 0.0996, 0.1625 - 0.0997],
        atol=1e-12,
    )  # fmt: skip


def test_ur5e_upright_pose():
    # Shoulder lift -pi/2 raises upper arm and forearm vertically; with wrist 1 at -pi/2 the
    # planar joints sum to -pi, which flips the d5 offset from down (q = 0) to up.
    q = np.array([0.0, -math.pi / 2, 0.0, -math.pi / 2, 0.0, 0.0])
    expected = [0.0, -0.1333 - 0.0996, 0.1625 + 0.425 + 0.3922 + 0.0997]
    np.testing.assert_allclose(UR5E.tcp_position(q), expected, atol=1e-12)


def test_ur5e_base_rotation_rotates_the_tcp_about_z():
    q = random_configurations("ur5e", 1, seed=3)[0]
    p = UR5E.tcp_position(q)
    turned = q.copy()
    turned[0] += 0.7
    c, s = math.cos(0.7), math.sin(0.7)
    np.testing.assert_allclose(
        UR5E.tcp_position(turned), [c * p[0] - s * p[1], s * p[0] + c * p[1], p[2]], atol=1e-12
    )


# Universal Robots' DH table (universal-robots.com "DH Parameters for calculations of
# kinematics and dynamics"), m: d1, a2, a3, d4, d5, d6.
UR_DH = {
    "ur3e": (0.15185, -0.24355, -0.2132, 0.13105, 0.08535, 0.0921),
    "ur5e": (0.1625, -0.425, -0.3922, 0.1333, 0.0997, 0.0996),
    "ur10e": (0.1807, -0.6127, -0.57155, 0.17415, 0.11985, 0.11655),
    "ur16e": (0.1807, -0.4784, -0.36, 0.17415, 0.11985, 0.11655),
    "ur20": (0.2363, -0.862, -0.7287, 0.201, 0.1593, 0.1543),
    "ur30": (0.2363, -0.637, -0.5037, 0.201, 0.1593, 0.1543),
}


@pytest.mark.parametrize("name", sorted(UR_DH))
def test_every_ur_type_has_the_published_dh_table(name):
    d1, a2, a3, d4, d5, d6 = UR_DH[name]
    chain = chain_for(name)
    assert chain.name == name and chain.dof == load_robot(name).dof == 6
    # q = 0 stretches the arm along -x (see the UR5e above); upright, the lengths add up in z.
    np.testing.assert_allclose(chain.tcp_position(np.zeros(6)), [a2 + a3, -d4 - d6, d1 - d5],
                               atol=1e-12)  # fmt: skip
    upright = np.array([0.0, -math.pi / 2, 0.0, -math.pi / 2, 0.0, 0.0])
    np.testing.assert_allclose(chain.tcp_position(upright), [0.0, -d4 - d6, d1 - a2 - a3 + d5],
                               atol=1e-12)  # fmt: skip


def test_batches_equal_single_evaluations():
    qs = random_configurations("panda", 5, seed=4)
    batch = FRANKA.tcp_position(qs)
    for q, p in zip(qs, batch, strict=True):
        np.testing.assert_allclose(FRANKA.tcp_position(q), p, atol=1e-15)


def test_tcp_speed_is_distance_over_time():
    home = np.array(load_robot("fr3").home)
    qs = np.stack([home, home + [0.1, 0, 0, 0, 0, 0, 0]])
    # Rotating joint 1 by 0.1 rad moves the TCP along a chord of radius 0.30689 m.
    chord = 2 * 0.30689 * math.sin(0.05)
    np.testing.assert_allclose(tcp_speeds(FRANKA, [0.0, 0.5], qs), [chord / 0.5], rtol=1e-4)


def test_wrong_dof_and_unknown_robot_are_refused():
    with pytest.raises(ValueError, match="expected 7"):
        FRANKA.tcp_position(np.zeros(6))
    with pytest.raises(ValueError, match="no kinematics"):
        chain_for("kuka")
    assert chain_for("panda") is FRANKA and chain_for("ur5e") is UR5E
