"""The Gazebo description (sim/description.py) against the MuJoCo model it comes from and the
DH kinematics the safety checks use: URDF forward kinematics, ros2_control block, controllers,
the SDF world's models and cameras, the bridge; sdformat's own check where its tool is here."""

from __future__ import annotations

import math
import shutil
import subprocess
from xml.etree import ElementTree as ET

import mujoco
import numpy as np
import pytest
import yaml

from vla_runtime.core.camera_calibration import pinhole_from_fovy
from vla_runtime.core.kinematics import chain_for
from vla_runtime.core.robot import load_robot
from vla_runtime.core.topics import camera_image, camera_info
from vla_runtime.sim.description import (
    FRAMES,
    NOMINAL_MASS,
    TCP_LINK,
    WORLD_LINK,
    bridge_config,
    controllers_config,
    describe_main,
    quat_matrix,
    robot_joint_names,
    robot_urdf,
    rpy_from_matrix,
    scene_model,
    workcell_sdf,
    write_gazebo_files,
)
from vla_runtime.sim.workcell import SceneConfig, cube_names

ROBOTS = sorted(FRAMES)
TOLERANCE = 1e-6  # m and rad
# MuJoCo's FR3 hand (franky-sim's fr3.xml quaternion, as MJCF text keeps it) is turned
# 1.16e-6 rad short of the DH tool's -45 degrees about the flange; the URDF keeps MuJoCo's frame.
DH_ORIENTATION_TOLERANCE = {"fr3": 1.2e-6, "ur5e": TOLERANCE}


def transform(xyz, rpy) -> np.ndarray:
    roll, pitch, yaw = rpy
    cr, sr, cp, sp = math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch)
    cy, sy = math.cos(yaw), math.sin(yaw)
    out = np.eye(4)
    out[:3, :3] = (
        np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
        @ np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
        @ np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
    )
    out[:3, 3] = xyz
    return out


def axis_motion(kind: str, axis, value: float) -> np.ndarray:
    """A revolute joint's rotation (Rodrigues) or a prismatic joint's shift along its axis."""
    axis = np.asarray(axis, dtype=float)
    out = np.eye(4)
    if kind == "prismatic":
        out[:3, 3] = axis * value
        return out
    skew = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    out[:3, :3] = np.eye(3) + math.sin(value) * skew + (1 - math.cos(value)) * skew @ skew
    return out


def parse_joints(urdf: str) -> dict[str, dict]:
    """child link -> its joint (name, type, parent, origin, axis, mimic) from the URDF text."""
    joints = {}
    for joint in ET.fromstring(urdf).findall("joint"):  # not ros2_control's
        origin = joint.find("origin")
        mimic = joint.find("mimic")
        joints[joint.find("child").get("link")] = {
            "name": joint.get("name"),
            "type": joint.get("type"),
            "parent": joint.find("parent").get("link"),
            "origin": transform(
                [float(v) for v in origin.get("xyz").split()],
                [float(v) for v in origin.get("rpy").split()],
            ),
            "axis": [float(v) for v in joint.find("axis").get("xyz").split()]
            if joint.find("axis") is not None
            else None,
            "mimic": mimic.get("joint") if mimic is not None else None,
        }
    return joints


def link_pose(joints: dict, link: str, positions: dict[str, float], root=WORLD_LINK):
    """4x4 pose of `link` in `root` by walking the joints up from it."""
    pose = np.eye(4)
    while link != root:
        joint = joints[link]
        value = positions.get(joint["mimic"] or joint["name"], 0.0)
        motion = np.eye(4) if joint["type"] == "fixed" else axis_motion(
            joint["type"], joint["axis"], value
        )  # fmt: skip
        pose = joint["origin"] @ motion @ pose
        link = joint["parent"]
    return pose


def rotation_angle(rotation: np.ndarray) -> float:
    """The angle (rad) of a rotation matrix, accurate for small angles too."""
    skew = np.array([rotation[2, 1] - rotation[1, 2], rotation[0, 2] - rotation[2, 0],
                     rotation[1, 0] - rotation[0, 1]])  # fmt: skip
    return math.atan2(np.linalg.norm(skew) / 2, (np.trace(rotation) - 1) / 2)


def random_configurations(robot_name: str, count: int, seed: int = 7) -> np.ndarray:
    robot = load_robot(robot_name)
    rng = np.random.default_rng(seed)
    return rng.uniform(robot.position_min, robot.position_max, size=(count, robot.dof))


@pytest.fixture(scope="module", params=ROBOTS)
def described(request):
    robot = request.param
    urdf = robot_urdf(robot, "/tmp/controllers.yaml")
    return robot, urdf, parse_joints(urdf)


def test_rpy_round_trips_including_gimbal_lock():
    rng = np.random.default_rng(1)
    angles = [*rng.uniform(-math.pi, math.pi, size=(20, 3)), (0.3, math.pi / 2, 0.0),
              (0.0, -math.pi / 2, 0.0)]  # fmt: skip
    for rpy in angles:
        rotation = transform([0, 0, 0], rpy)[:3, :3]
        again = transform([0, 0, 0], rpy_from_matrix(rotation))[:3, :3]
        assert np.allclose(again, rotation, atol=1e-12)


def test_urdf_fk_matches_the_dh_kinematics(described):
    """TCP pose and flange position in the arm's base frame, URDF against core/kinematics.py."""
    robot_name, _, joints = described
    robot, chain, frames = load_robot(robot_name), chain_for(robot_name), FRAMES[robot_name]
    for q in random_configurations(robot_name, 25):
        positions = dict(zip(robot.joints, q, strict=True))
        tcp = link_pose(joints, TCP_LINK, positions, root=frames.base_body)
        hand = link_pose(joints, frames.hand_body, positions, root=frames.base_body)
        expected = chain.joint_frames(q)
        assert np.abs(tcp[:3, 3] - expected[-1, :3, 3]).max() < TOLERANCE
        assert (
            rotation_angle(tcp[:3, :3].T @ expected[-1, :3, :3])
            < DH_ORIENTATION_TOLERANCE[robot_name]
        )
        assert np.abs(hand[:3, 3] - expected[-2, :3, 3]).max() < TOLERANCE


def test_urdf_fk_matches_mujoco_body_poses(described):
    """Every link in the world, URDF against MuJoCo's own kinematics, fingers included."""
    robot_name, _, joints = described
    robot = load_robot(robot_name)
    model, _ = scene_model(SceneConfig(robot=robot_name, n_cubes=0))
    data = mujoco.MjData(model)
    names = robot_joint_names(robot)
    rng = np.random.default_rng(3)
    for q in random_configurations(robot_name, 10):
        finger = rng.uniform(0.0, model.jnt_range[model.joint("finger_joint1").id][1])
        positions = {**dict(zip(robot.joints, q, strict=True)), names["finger_joint1"]: finger}
        data.qpos[: robot.dof] = q
        data.qpos[robot.dof : robot.dof + 2] = finger
        mujoco.mj_kinematics(model, data)
        for link in joints:
            if link == TCP_LINK:
                continue
            pose = link_pose(joints, link, positions)
            assert np.abs(pose[:3, 3] - data.body(link).xpos).max() < TOLERANCE, link
            assert np.abs(pose[:3, :3] - data.body(link).xmat.reshape(3, 3)).max() < TOLERANCE


def test_urdf_joints_limits_and_inertials_come_from_the_robot_and_the_model(described):
    robot_name, urdf, _ = described
    robot = load_robot(robot_name)
    model, _ = scene_model(SceneConfig(robot=robot_name, n_cubes=0))
    root = ET.fromstring(urdf)
    movable = {j.get("name"): j for j in root.findall("joint") if j.get("type") != "fixed"}
    assert list(movable) == [*robot.joints, *robot.gripper_joints]
    for i, name in enumerate(robot.joints):
        limit = movable[name].find("limit")
        assert float(limit.get("lower")) == robot.position_min[i]
        assert float(limit.get("upper")) == robot.position_max[i]
        assert float(limit.get("velocity")) == robot.velocity[i]
        assert float(limit.get("effort")) > 0
    assert movable[robot.gripper_joints[1]].find("mimic").get("joint") == robot.gripper_joints[0]
    for link in root.iter("link"):
        inertial = link.find("inertial")
        if inertial is not None:
            mass = float(inertial.find("mass").get("value"))
            expected = model.body(link.get("name")).mass[0]
            assert mass == pytest.approx(expected if expected > 0 else NOMINAL_MASS)


def test_mesh_files_exist_and_are_placed_as_mujoco_compiles_them(described):
    """A URDF mesh is the file's own frame: the MJCF's geom pose. MuJoCo compiles the geom to
    the mesh's centroid (mesh_pos, mesh_quat); both must give the compiled pose."""
    robot_name, urdf, _ = described
    model, spec = scene_model(SceneConfig(robot=robot_name, n_cubes=0))
    for mesh in ET.fromstring(urdf).iter("mesh"):
        assert mesh.get("filename").startswith("file:///")
        assert shutil.os.path.isfile(mesh.get("filename").removeprefix("file://"))
    for geom in range(model.ngeom):
        if model.geom_type[geom] != int(mujoco.mjtGeom.mjGEOM_MESH):
            continue
        body = model.geom_bodyid[geom]
        spec_geom = spec.body(model.body(body).name).geoms[geom - model.body_geomadr[body]]
        mesh = model.geom_dataid[geom]
        rotation = quat_matrix(spec_geom.quat)
        assert np.allclose(np.asarray(spec_geom.pos) + rotation @ model.mesh_pos[mesh],
                           model.geom_pos[geom], atol=TOLERANCE)  # fmt: skip
        assert np.allclose(rotation @ quat_matrix(model.mesh_quat[mesh]),
                           quat_matrix(model.geom_quat[geom]), atol=TOLERANCE)  # fmt: skip


def test_ros2_control_block_and_controllers(described):
    robot_name, urdf, _ = described
    robot = load_robot(robot_name)
    root = ET.fromstring(urdf)
    control = root.find("ros2_control")
    assert control.find("hardware/plugin").text == "gz_ros2_control/GazeboSimSystem"
    interfaces = {
        joint.get("name"): (
            [c.get("name") for c in joint.findall("command_interface")],
            [s.get("name") for s in joint.findall("state_interface")],
        )
        for joint in control.findall("joint")
    }
    commanded = [*robot.joints, robot.gripper_joints[0]]
    assert list(interfaces) == [*commanded, robot.gripper_joints[1]]
    for name in commanded:
        assert interfaces[name] == (["position"], ["position", "velocity"])
    assert interfaces[robot.gripper_joints[1]] == ([], ["position", "velocity"])
    plugin = root.find("gazebo/plugin")
    assert plugin.get("filename") == "gz_ros2_control-system"
    assert plugin.find("parameters").text == "/tmp/controllers.yaml"

    config = controllers_config(robot_name)["/**"]
    manager = config["controller_manager"]["ros__parameters"]
    for key in ("trajectory", "forward_position", "gripper"):
        assert robot.controller(key) in manager
    assert config[robot.controller("trajectory")]["ros__parameters"]["joints"] == list(robot.joints)
    assert config[robot.controller("forward_position")]["ros__parameters"]["joints"] == list(
        robot.joints
    )
    assert config[robot.controller("gripper")]["ros__parameters"]["joints"] == [
        robot.gripper_joints[0]
    ]


def test_urdf_parses_with_urdf_parser_py(described):
    urdf_module = pytest.importorskip("urdf_parser_py.urdf")
    robot_name, urdf, joints = described
    parsed = urdf_module.URDF.from_xml_string(urdf)
    assert parsed.get_root() == WORLD_LINK
    for joint in parsed.joints:
        ours = joints[joint.child]
        assert np.allclose(transform(joint.origin.xyz, joint.origin.rpy), ours["origin"])
        assert joint.type == ours["type"]


def camera_world_pose(model, data, name) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = data.camera(name).xmat.reshape(3, 3)
    out[:3, 3] = data.camera(name).xpos
    return out


def sensor_pose(sensor: ET.Element) -> np.ndarray:
    values = [float(v) for v in sensor.find("pose").text.split()]
    return transform(values[:3], values[3:])


def test_cameras_have_mujocos_poses_and_intrinsics():
    """A Gazebo camera looks along +x with z up; MuJoCo's along -z with y up."""
    config = SceneConfig(robot="fr3")
    model, _ = scene_model(config)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    world = ET.fromstring(workcell_sdf(config, image_size=160))
    urdf = ET.fromstring(robot_urdf("fr3", "/tmp/c.yaml", image_size=160))
    scene = world.find("world/model[@name='scene_camera']/link/sensor")
    wrist = urdf.find("gazebo[@reference='hand']/sensor")
    hand = np.eye(4)
    hand[:3, :3], hand[:3, 3] = data.body("hand").xmat.reshape(3, 3), data.body("hand").xpos
    for name, sensor, parent in (("scene", scene, np.eye(4)), ("wrist", wrist, hand)):
        gz = parent @ sensor_pose(sensor)
        mj = camera_world_pose(model, data, name)
        assert np.allclose(gz[:3, 3], mj[:3, 3], atol=TOLERANCE)
        assert np.allclose(gz[:3, 0], -mj[:3, 2], atol=TOLERANCE)  # optical axis
        assert np.allclose(gz[:3, 2], mj[:3, 1], atol=TOLERANCE)  # up
        lens = sensor.find("camera")
        width = int(lens.find("image/width").text)
        focal = 0.5 * width / math.tan(float(lens.find("horizontal_fov").text) / 2)
        expected = pinhole_from_fovy(model.cam_fovy[model.camera(name).id], 160, 160)
        assert focal == pytest.approx(expected[0, 0], rel=1e-9)
        assert sensor.find("topic").text == camera_image(name)
        assert lens.find("camera_info_topic").text == camera_info(name)


def test_world_has_the_workcell_models():
    config = SceneConfig(robot="ur5e", n_cubes=3, seed=5)
    world = ET.fromstring(workcell_sdf(config, robot_uri="/models/ur5e")).find("world")
    names = [m.get("name") for m in world.findall("model")]
    assert names == ["floor", "table", *cube_names(config), "scene_camera"]
    assert world.find("include/uri").text == "/models/ur5e"
    model, _ = scene_model(config)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    for cube in cube_names(config):
        pose = [float(v) for v in world.find(f"model[@name='{cube}']/pose").text.split()]
        assert np.allclose(pose[:3], data.body(cube).xpos, atol=TOLERANCE)
        assert np.allclose(transform(pose[:3], pose[3:])[:3, :3],
                           data.body(cube).xmat.reshape(3, 3), atol=TOLERANCE)  # fmt: skip


def test_bridge_carries_clock_and_cameras_gazebo_to_ros():
    entries = bridge_config(SceneConfig())
    topics = [e["ros_topic_name"] for e in entries]
    assert topics == ["/clock", camera_image("scene"), camera_info("scene"),
                      camera_image("wrist"), camera_info("wrist")]  # fmt: skip
    assert all(e["direction"] == "GZ_TO_ROS" and e["gz_topic_name"] == e["ros_topic_name"]
               for e in entries)  # fmt: skip


def sdf_tool() -> list[str] | None:
    """gz (Gazebo Harmonic and later) or ign (Fortress, Debian 12's libsdformat-dev) `sdf`."""
    for tool in ("gz", "ign"):
        if shutil.which(tool):
            probe = subprocess.run([tool, "sdf", "--help"], capture_output=True, text=True)
            if probe.returncode == 0 and "--check" in probe.stdout + probe.stderr:
                return [tool, "sdf"]
    return None


@pytest.mark.parametrize("robot", ROBOTS)
def test_sdformat_checks_the_urdf_and_the_world(tmp_path, robot):
    tool = sdf_tool()
    if tool is None:
        pytest.skip("no sdformat command (`gz sdf` or `ign sdf`: Debian 12's libsdformat-dev "
                    "and ignition-tools, or the Docker image's ros-jazzy-ros-gz)")  # fmt: skip
    files = write_gazebo_files(tmp_path, SceneConfig(robot=robot), include_robot=True)
    for path in (files.urdf, files.world):
        checked = subprocess.run([*tool, "-k", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0 and "Valid" in checked.stdout, (
            checked.stdout + checked.stderr
        )
    # The wrist camera survives sdformat's merging of the fixed hand joint into the last link.
    printed = subprocess.run([*tool, "-p", str(files.urdf)], capture_output=True, text=True)
    assert "<sensor name='wrist_camera' type='camera'>" in printed.stdout


def test_describe_command_writes_the_files(tmp_path, capsys):
    assert describe_main(["--robot", "ur5e", "--urdf", str(tmp_path / "ur5e.urdf")]) == 0
    assert ET.parse(tmp_path / "ur5e.urdf").getroot().get("name") == "ur5e"
    assert yaml.safe_load((tmp_path / "ur5e_controllers.yaml").read_text())["/**"]
    assert describe_main(["--out", str(tmp_path / "all"), "--include-robot"]) == 0
    for name in ("fr3/model.urdf", "fr3/model.config", "vla_workcell.sdf", "bridge.yaml",
                 "fr3_controllers.yaml"):  # fmt: skip
        assert (tmp_path / "all" / name).is_file()
