"""The MuJoCo workcell as Gazebo reads it: a URDF of the robot (with the ros2_control block of
gz_ros2_control), its controllers YAML, an SDF world of the workcell and the ros_gz_bridge YAML.

One description, two outputs: the URDF is walked from the compiled MuJoCo model (body frames,
joint axes, masses and inertias, geoms; the mesh files where the model has them), the limits
come from config/robots/<robot>.yaml, and the SDF cameras have the MuJoCo cameras' poses and
fields of view, so Gazebo and MuJoCo simulate the same arm in the same scene. No ROS imports.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree as ET

import mujoco
import numpy as np
import yaml

from vla_runtime.core.gripper import max_finger_speed, max_opening
from vla_runtime.core.robot import RobotConfig, load_robot
from vla_runtime.core.topics import CLOCK, camera_image, camera_info
from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.simulator import MODEL_FINGER_JOINTS
from vla_runtime.sim.workcell import (
    COLOURS,
    FLOOR_Z,
    GRASP_FORCE,
    TABLE_CENTRE_X,
    TABLE_HALF_SIZE,
    SceneConfig,
    cube_names,
    cube_poses,
)

WORLD_LINK = "world"  # a URDF link named world: Gazebo fixes the robot's base to the world
TCP_LINK = "tcp"
WORLD_NAME = "vla_workcell"
CUBE_MASS = 0.05  # kg, as workcell.add_workcell
GZ_CONTROL_PLUGIN = ("gz_ros2_control-system", "gz_ros2_control::GazeboSimROS2ControlPlugin")


@dataclass(frozen=True)
class RobotFrames:
    base_body: str  # the MuJoCo body of the arm's base frame (the FK's frame 0)
    hand_body: str  # the body the wrist camera and the TCP hang from
    # The TCP along the hand body's z (m): franka_description's fr3_hand_tcp for the Franka
    # Hand; the UR5e's FK (core/kinematics.py) ends at the flange, the hand body's own frame.
    tcp_offset: float


FRAMES = {
    "fr3": RobotFrames(base_body="base", hand_body="hand", tcp_offset=0.1034),
    "ur5e": RobotFrames(base_body="ur5e_base", hand_body="hand", tcp_offset=0.0),
}


@dataclass(frozen=True)
class CameraSpec:
    """A MuJoCo camera as a Gazebo camera sensor sees it."""

    name: str
    body: str  # the MuJoCo body it is mounted on ("world" for the scene camera)
    position: np.ndarray  # in the body frame
    rotation: np.ndarray  # 3x3, Gazebo's camera frame (looks along +x, z up) in the body frame
    horizontal_fov: float  # rad
    width: int
    height: int


def robot_frames(robot: str) -> RobotFrames:
    if robot not in FRAMES:
        raise ValueError(f"no Gazebo description for robot {robot!r}; known: {sorted(FRAMES)}")
    return FRAMES[robot]


def _number(value: float) -> str:
    # repr round-trips a float exactly, so the description keeps MuJoCo's frames to the bit.
    return repr(float(value))


def _vector(values) -> str:
    return " ".join(_number(v) for v in values)


def rpy_from_matrix(rotation) -> tuple[float, float, float]:
    """URDF/SDF roll, pitch, yaw (R = Rz(yaw) Ry(pitch) Rx(roll)) of a rotation matrix."""
    r = np.asarray(rotation, dtype=float)
    cos_pitch = math.hypot(r[0, 0], r[1, 0])
    pitch = math.atan2(-r[2, 0], cos_pitch)
    if cos_pitch < 1e-12:  # pitch +-90 degrees: roll and yaw turn about one axis
        return math.atan2(-r[1, 2], r[1, 1]), pitch, 0.0
    return math.atan2(r[2, 1], r[2, 2]), pitch, math.atan2(r[1, 0], r[0, 0])


def quat_matrix(quat) -> np.ndarray:
    """3x3 rotation of a MuJoCo quaternion (w, x, y, z; normalised here)."""
    q = np.asarray(quat, dtype=float)
    out = np.zeros(9)
    mujoco.mju_quat2Mat(out, q / np.linalg.norm(q))
    return out.reshape(3, 3)


def _origin(parent: ET.Element, pos, rotation) -> None:
    ET.SubElement(parent, "origin", xyz=_vector(pos), rpy=_vector(rpy_from_matrix(rotation)))


def _pose_text(pos, rotation) -> str:
    return _vector([*pos, *rpy_from_matrix(rotation)])


def scene_model(config: SceneConfig) -> tuple[mujoco.MjModel, mujoco.MjSpec]:
    """The compiled scene and its MJCF read back uncompiled: the spec keeps each mesh's file and
    the pose of the file's frame, which compiling moves to the mesh's centroid."""
    model, xml = build_scene(config)
    return model, mujoco.MjSpec.from_string(xml)


def _geometries(model: mujoco.MjModel, spec: mujoco.MjSpec, geom: int, spec_geom):
    """(URDF geometry tag, attributes, position, rotation) of one geom in its body's frame; a
    capsule is a cylinder and two spheres (URDF has no capsule)."""
    kind = mujoco.mjtGeom(int(model.geom_type[geom]))
    size = model.geom_size[geom]
    pos, rotation = model.geom_pos[geom], quat_matrix(model.geom_quat[geom])
    if kind == mujoco.mjtGeom.mjGEOM_BOX:
        return [("box", {"size": _vector(2 * size)}, pos, rotation)]
    if kind == mujoco.mjtGeom.mjGEOM_SPHERE:
        return [("sphere", {"radius": _number(size[0])}, pos, rotation)]
    if kind in (mujoco.mjtGeom.mjGEOM_CYLINDER, mujoco.mjtGeom.mjGEOM_CAPSULE):
        radius, half = size[0], size[1]
        cylinder = {"radius": _number(radius), "length": _number(2 * half)}
        parts = [("cylinder", cylinder, pos, rotation)]
        if kind == mujoco.mjtGeom.mjGEOM_CAPSULE:
            for sign in (1.0, -1.0):
                end = pos + rotation @ np.array([0.0, 0.0, sign * half])
                parts.append(("sphere", {"radius": _number(radius)}, end, rotation))
        return parts
    quat_oriented = spec_geom.alt.type == mujoco.mjtOrientation.mjORIENTATION_QUAT
    if kind == mujoco.mjtGeom.mjGEOM_MESH and quat_oriented:
        mesh = spec.mesh(spec_geom.meshname)
        path = (Path(spec.meshdir) / mesh.file).resolve()
        attributes = {"filename": f"file://{path}", "scale": _vector(mesh.scale)}
        return [("mesh", attributes, np.asarray(spec_geom.pos), quat_matrix(spec_geom.quat))]
    # Anything else: the geom's bounding box.
    centre, half = model.geom_aabb[geom][:3], model.geom_aabb[geom][3:]
    return [("box", {"size": _vector(2 * half)}, pos + rotation @ centre, rotation)]


def _add_geoms(link: ET.Element, model, spec, body: int) -> None:
    spec_geoms = spec.body(model.body(body).name).geoms
    for k, spec_geom in enumerate(spec_geoms):
        geom = model.body_geomadr[body] + k
        # MuJoCo geoms that collide with nothing are drawn only; the others collide and are
        # drawn (the FR3's visual meshes carry the colours, its collision meshes are coarse).
        collides = model.geom_contype[geom] or model.geom_conaffinity[geom]
        tags = ("collision",) if collides and model.geom_group[geom] == 3 else ("visual",)
        if collides and model.geom_group[geom] != 3:
            tags = ("collision", "visual")
        for tag in tags:
            for shape, attributes, pos, rotation in _geometries(model, spec, geom, spec_geom):
                element = ET.SubElement(link, tag)
                _origin(element, pos, rotation)
                ET.SubElement(ET.SubElement(element, "geometry"), shape, attributes)
                if tag == "visual":
                    material = ET.SubElement(element, "material", name=f"rgba_{geom}")
                    ET.SubElement(material, "color", rgba=_vector(model.geom_rgba[geom]))


NOMINAL_MASS = 1e-3  # kg, of a massless link that carries a moving joint


def _add_inertial(link: ET.Element, model, body: int, carries_joint: bool) -> None:
    mass = model.body_mass[body]
    if mass <= 0.0 and not carries_joint:
        return  # a frame only: sdformat merges it into its parent
    inertial = ET.SubElement(link, "inertial")
    if mass <= 0.0:
        # sdformat drops a massless link, and the joints it carries with it (the UR5e's base,
        # fixed to the world, has no mass in the MuJoCo model).
        _origin(inertial, [0.0, 0.0, 0.0], np.eye(3))
        ET.SubElement(inertial, "mass", value=_number(NOMINAL_MASS))
        moment = _number(NOMINAL_MASS * 1e-3)
        ET.SubElement(inertial, "inertia", ixx=moment, iyy=moment, izz=moment,
                      ixy="0", ixz="0", iyz="0")  # fmt: skip
        return
    _origin(inertial, model.body_ipos[body], quat_matrix(model.body_iquat[body]))
    ET.SubElement(inertial, "mass", value=_number(mass))
    ixx, iyy, izz = model.body_inertia[body]  # principal moments in the inertial frame
    ET.SubElement(inertial, "inertia", ixx=_number(ixx), iyy=_number(iyy), izz=_number(izz),
                  ixy="0", ixz="0", iyz="0")  # fmt: skip


def robot_joint_names(robot: RobotConfig) -> dict[str, str]:
    """MuJoCo joint name -> the ROS joint name (/joint_states, controllers)."""
    names = {joint: joint for joint in robot.joints}
    names.update(zip(MODEL_FINGER_JOINTS, robot.gripper_joints, strict=True))
    return names


def _robot_bodies(model: mujoco.MjModel, base_body: str) -> list[int]:
    """The base body and every body below it, parents first."""
    base = model.body(base_body).id
    inside = {base}
    for body in range(base + 1, model.nbody):  # MuJoCo numbers parents before children
        if model.body_parentid[body] in inside:
            inside.add(body)
    return sorted(inside)


def _joint_element(root, name, kind, parent, child, pos, rotation) -> ET.Element:
    joint = ET.SubElement(root, "joint", name=name, type=kind)
    _origin(joint, pos, rotation)
    ET.SubElement(joint, "parent", link=parent)
    ET.SubElement(joint, "child", link=child)
    return joint


def _ros2_control(root: ET.Element, robot: RobotConfig, controllers_yaml: str) -> None:
    """gz_ros2_control's system: position commands, position and velocity states per arm joint
    and for the first finger; the second finger follows it (a URDF mimic), state only."""
    control = ET.SubElement(root, "ros2_control", name="GazeboSimSystem", type="system")
    hardware = ET.SubElement(control, "hardware")
    ET.SubElement(hardware, "plugin").text = "gz_ros2_control/GazeboSimSystem"
    finger, follower = robot.gripper_joints
    lows = [*robot.position_min, 0.0]
    highs = [*robot.position_max, max_opening(robot)]
    initial = [*robot.home, max_opening(robot)]
    for name, low, high, start in zip([*robot.joints, finger], lows, highs, initial, strict=True):
        joint = ET.SubElement(control, "joint", name=name)
        command = ET.SubElement(joint, "command_interface", name="position")
        ET.SubElement(command, "param", name="min").text = _number(low)
        ET.SubElement(command, "param", name="max").text = _number(high)
        position = ET.SubElement(joint, "state_interface", name="position")
        ET.SubElement(position, "param", name="initial_value").text = _number(start)
        ET.SubElement(joint, "state_interface", name="velocity")
    joint = ET.SubElement(control, "joint", name=follower)
    position = ET.SubElement(joint, "state_interface", name="position")
    ET.SubElement(position, "param", name="initial_value").text = _number(max_opening(robot))
    ET.SubElement(joint, "state_interface", name="velocity")
    plugin = ET.SubElement(ET.SubElement(root, "gazebo"), "plugin")
    plugin.set("filename", GZ_CONTROL_PLUGIN[0])
    plugin.set("name", GZ_CONTROL_PLUGIN[1])
    ET.SubElement(plugin, "parameters").text = controllers_yaml


def camera_specs(model: mujoco.MjModel, width: int, height: int) -> list[CameraSpec]:
    """The model's cameras for Gazebo: a MuJoCo camera looks along its -z with y up, a Gazebo
    camera along its +x with z up; MuJoCo's fovy is vertical, Gazebo's horizontal (square
    pixels, so both give the same focal length in pixels)."""
    gz_in_mujoco = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]])
    cameras = []
    for camera in range(model.ncam):
        fovy = math.radians(model.cam_fovy[camera])
        cameras.append(
            CameraSpec(
                name=model.camera(camera).name,
                body=model.body(model.cam_bodyid[camera]).name,
                position=model.cam_pos[camera].copy(),
                rotation=quat_matrix(model.cam_quat[camera]) @ gz_in_mujoco,
                horizontal_fov=2.0 * math.atan(math.tan(fovy / 2.0) * width / height),
                width=width,
                height=height,
            )
        )
    return cameras


def _camera_sensor(parent: ET.Element, camera: CameraSpec, fps: float) -> ET.Element:
    sensor = ET.SubElement(parent, "sensor", name=f"{camera.name}_camera", type="camera")
    ET.SubElement(sensor, "pose").text = _pose_text(camera.position, camera.rotation)
    ET.SubElement(sensor, "always_on").text = "true"
    ET.SubElement(sensor, "update_rate").text = _number(fps)
    # The gz topics are the ROS ones, so the bridge maps names one to one.
    ET.SubElement(sensor, "topic").text = camera_image(camera.name)
    lens = ET.SubElement(sensor, "camera", name=camera.name)
    ET.SubElement(lens, "camera_info_topic").text = camera_info(camera.name)
    ET.SubElement(lens, "horizontal_fov").text = _number(camera.horizontal_fov)
    image = ET.SubElement(lens, "image")
    ET.SubElement(image, "width").text = str(camera.width)
    ET.SubElement(image, "height").text = str(camera.height)
    ET.SubElement(image, "format").text = "R8G8B8"
    clip = ET.SubElement(lens, "clip")
    ET.SubElement(clip, "near").text = "0.01"
    ET.SubElement(clip, "far").text = "10.0"
    return sensor


def _text(root: ET.Element) -> str:
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def robot_urdf(
    robot_name: str,
    controllers_yaml: str,
    image_size: int = 224,
    camera_fps: float = 15.0,
) -> str:
    """The robot's URDF: links and joints of the MuJoCo model (ROS joint names), a `tcp` link,
    the wrist camera as a Gazebo sensor, and the ros2_control block reading `controllers_yaml`."""
    frames = robot_frames(robot_name)
    robot = load_robot(robot_name)
    model, spec = scene_model(SceneConfig(robot=robot_name, n_cubes=0))
    names = robot_joint_names(robot)
    root = ET.Element("robot", name=robot_name)
    ET.SubElement(root, "link", name=WORLD_LINK)
    bodies = _robot_bodies(model, frames.base_body)
    for body in bodies:
        name = model.body(body).name
        link = ET.SubElement(root, "link", name=name)
        carries_joint = any(
            model.body_parentid[child] == body and model.body_jntnum[child] for child in bodies
        )
        _add_inertial(link, model, body, carries_joint)
        _add_geoms(link, model, spec, body)
        parent = model.body(model.body_parentid[body]).name
        pos, rotation = model.body_pos[body], quat_matrix(model.body_quat[body])
        if body == bodies[0]:
            _joint_element(
                root, f"{WORLD_LINK}_to_{name}", "fixed", WORLD_LINK, name, pos, rotation
            )
            continue
        if model.body_jntnum[body] == 0:
            _joint_element(root, f"{parent}_to_{name}", "fixed", parent, name, pos, rotation)
            continue
        if model.body_jntnum[body] != 1 or np.any(model.jnt_pos[model.body_jntadr[body]]):
            raise ValueError(f"{name}: one joint at the body's origin expected")
        joint_id = model.body_jntadr[body]
        model_name = model.joint(joint_id).name
        hinge = mujoco.mjtJoint(int(model.jnt_type[joint_id])) == mujoco.mjtJoint.mjJNT_HINGE
        joint = _joint_element(root, names[model_name], "revolute" if hinge else "prismatic",
                               parent, name, pos, rotation)  # fmt: skip
        ET.SubElement(joint, "axis", xyz=_vector(model.jnt_axis[joint_id]))
        if model_name in robot.joints:
            i = robot.joints.index(model_name)
            low, high = robot.position_min[i], robot.position_max[i]
            effort, velocity = model.jnt_actfrcrange[joint_id][1], robot.velocity[i]
        else:
            low, high = model.jnt_range[joint_id]
            effort, velocity = GRASP_FORCE, max_finger_speed(robot)
        ET.SubElement(joint, "limit", lower=_number(low), upper=_number(high),
                      effort=_number(effort), velocity=_number(velocity))  # fmt: skip
        if model_name == MODEL_FINGER_JOINTS[1]:
            # MuJoCo couples the fingers with an equality constraint; URDF with a mimic.
            ET.SubElement(joint, "mimic", joint=names[MODEL_FINGER_JOINTS[0]], multiplier="1",
                          offset="0")  # fmt: skip
    ET.SubElement(root, "link", name=TCP_LINK)
    _joint_element(root, f"{frames.hand_body}_to_{TCP_LINK}", "fixed", frames.hand_body,
                   TCP_LINK, [0.0, 0.0, frames.tcp_offset], np.eye(3))  # fmt: skip
    for camera in camera_specs(model, image_size, image_size):
        if camera.body != "world":
            reference = ET.SubElement(root, "gazebo", reference=camera.body)
            _camera_sensor(reference, camera, camera_fps)
    _ros2_control(root, robot, controllers_yaml)
    return _text(root)


def controllers_config(robot_name: str, update_rate_hz: int = 1000) -> dict:
    """ros2_control controllers for the Gazebo arm, named as config/robots/<robot>.yaml names
    them so that the safety gate's topics are the MuJoCo sim stack's. On the UR5e the
    `scaled_joint_trajectory_controller` is a plain JointTrajectoryController (Gazebo has no
    speed scaling). `/**` keys reach the controller manager under any namespace."""
    robot = load_robot(robot_name)
    trajectory = robot.controller("trajectory")
    forward = robot.controller("forward_position")
    gripper = robot.controller("gripper")
    joints = list(robot.joints)
    group = "position_controllers/JointGroupPositionController"
    return {
        "/**": {
            "controller_manager": {
                "ros__parameters": {
                    "update_rate": update_rate_hz,
                    "use_sim_time": True,
                    "joint_state_broadcaster": {
                        "type": "joint_state_broadcaster/JointStateBroadcaster"
                    },
                    trajectory: {"type": "joint_trajectory_controller/JointTrajectoryController"},
                    forward: {"type": group},
                    gripper: {"type": group},
                }
            },
            trajectory: {
                "ros__parameters": {
                    "joints": joints,
                    "command_interfaces": ["position"],
                    "state_interfaces": ["position", "velocity"],
                    # A new one-point trajectory replaces the last before it ends (the gate).
                    "allow_nonzero_velocity_at_trajectory_end": True,
                }
            },
            forward: {"ros__parameters": {"joints": joints}},
            gripper: {"ros__parameters": {"joints": [robot.gripper_joints[0]]}},
        }
    }


def controllers_yaml(robot_name: str) -> str:
    return yaml.safe_dump(controllers_config(robot_name), sort_keys=False)


def _box_geometry(parent: ET.Element, size) -> None:
    ET.SubElement(ET.SubElement(parent, "geometry"), "box").append(_element("size", _vector(size)))


def _element(tag: str, text: str) -> ET.Element:
    element = ET.Element(tag)
    element.text = text
    return element


def _material(parent: ET.Element, rgba) -> None:
    material = ET.SubElement(parent, "material")
    material.append(_element("ambient", _vector(rgba)))
    material.append(_element("diffuse", _vector(rgba)))


def _box_model(world, name, pos, rotation, size, rgba, mass: float | None) -> None:
    model = ET.SubElement(world, "model", name=name)
    model.append(_element("static", "false" if mass else "true"))
    model.append(_element("pose", _pose_text(pos, rotation)))
    link = ET.SubElement(model, "link", name="link")
    if mass:
        inertial = ET.SubElement(link, "inertial")
        inertial.append(_element("mass", _number(mass)))
        inertia = ET.SubElement(inertial, "inertia")
        moments = [mass / 12.0 * (size[1] ** 2 + size[2] ** 2),
                   mass / 12.0 * (size[0] ** 2 + size[2] ** 2),
                   mass / 12.0 * (size[0] ** 2 + size[1] ** 2)]  # fmt: skip
        for tag, value in zip(("ixx", "iyy", "izz"), moments, strict=True):
            inertia.append(_element(tag, _number(value)))
    for tag in ("collision", "visual"):
        element = ET.SubElement(link, tag, name=tag)
        _box_geometry(element, size)
        if tag == "visual":
            _material(element, rgba)


def workcell_sdf(
    config: SceneConfig,
    robot_uri: str = "",
    image_size: int = 224,
    camera_fps: float = 15.0,
) -> str:
    """The SDF world: Gazebo's systems, sun, floor, table, the seeded coloured cubes, the scene
    camera and, given `robot_uri` (the robot's URDF), the robot; without it the robot is
    spawned separately (ros_gz_sim create), as gz_ros2_control wants."""
    model, _ = scene_model(config)
    root = ET.Element("sdf", version="1.9")
    world = ET.SubElement(root, "world", name=WORLD_NAME)
    physics = ET.SubElement(world, "physics", name="1ms", type="ignored")
    physics.append(_element("max_step_size", _number(model.opt.timestep)))
    physics.append(_element("real_time_factor", "1.0"))
    for system in ("physics", "user-commands", "scene-broadcaster", "sensors"):
        class_name = "".join(part.capitalize() for part in system.split("-"))
        plugin = ET.SubElement(world, "plugin", filename=f"gz-sim-{system}-system",
                               name=f"gz::sim::systems::{class_name}")  # fmt: skip
        if system == "sensors":
            plugin.append(_element("render_engine", "ogre2"))
    world.append(_element("gravity", _vector(model.opt.gravity)))
    light = ET.SubElement(world, "light", name="sun", type="directional")
    light.append(_element("pose", "0.5 0 2 0 0 0"))
    light.append(_element("diffuse", "0.7 0.7 0.7 1"))
    light.append(_element("direction", "0 0 -1"))
    light.append(_element("cast_shadows", "false"))
    floor = ET.SubElement(world, "model", name="floor")
    floor.append(_element("static", "true"))
    floor.append(_element("pose", _vector([0, 0, FLOOR_Z, 0, 0, 0])))
    floor_link = ET.SubElement(floor, "link", name="link")
    for tag in ("collision", "visual"):
        element = ET.SubElement(floor_link, tag, name=tag)
        plane = ET.SubElement(ET.SubElement(element, "geometry"), "plane")
        plane.append(_element("normal", "0 0 1"))
        plane.append(_element("size", "6 6"))
    table_size = [2 * h for h in TABLE_HALF_SIZE]
    _box_model(world, "table", [TABLE_CENTRE_X, 0.0, -TABLE_HALF_SIZE[2]], np.eye(3),
               table_size, [0.62, 0.48, 0.33, 1.0], mass=None)  # fmt: skip
    poses = cube_poses(config.n_cubes, config.seed, config.cube_size)
    for name, colour, (pos, quat) in zip(cube_names(config), config.colours, poses, strict=False):
        _box_model(world, name, pos, quat_matrix(quat), [config.cube_size] * 3,
                   COLOURS[colour], mass=CUBE_MASS)  # fmt: skip
    for camera in camera_specs(model, image_size, image_size):
        if camera.body == "world":
            holder = ET.SubElement(world, "model", name=f"{camera.name}_camera")
            holder.append(_element("static", "true"))
            _camera_sensor(ET.SubElement(holder, "link", name="link"), camera, camera_fps)
    if robot_uri:
        include = ET.SubElement(world, "include")
        include.append(_element("uri", robot_uri))
        include.append(_element("name", config.robot))
    return _text(root)


def bridge_config(config: SceneConfig) -> list[dict]:
    """ros_gz_bridge parameter_bridge entries: /clock and each camera's image and camera_info,
    Gazebo to ROS under the MuJoCo sim stack's topic names."""
    entries = [(CLOCK, "rosgraph_msgs/msg/Clock", "gz.msgs.Clock")]
    for camera in config.cameras:
        entries.append((camera_image(camera), "sensor_msgs/msg/Image", "gz.msgs.Image"))
        entries.append((camera_info(camera), "sensor_msgs/msg/CameraInfo", "gz.msgs.CameraInfo"))
    return [
        {"ros_topic_name": topic, "gz_topic_name": topic, "ros_type_name": ros_type,
         "gz_type_name": gz_type, "direction": "GZ_TO_ROS"}
        for topic, ros_type, gz_type in entries
    ]  # fmt: skip


def bridge_yaml(config: SceneConfig) -> str:
    return yaml.safe_dump(bridge_config(config), sort_keys=False)


MODEL_CONFIG = """<?xml version="1.0"?>
<model>
  <name>{name}</name>
  <version>1.0</version>
  <sdf version="1.9">model.urdf</sdf>
</model>
"""


@dataclass(frozen=True)
class GazeboFiles:
    urdf: Path  # inside a Gazebo model folder (model.config beside it), which a world includes
    world: Path
    controllers: Path
    bridge: Path


def write_gazebo_files(
    folder: Path,
    config: SceneConfig,
    image_size: int = 224,
    camera_fps: float = 15.0,
    include_robot: bool = False,
) -> GazeboFiles:
    """Write the URDF (as the Gazebo model folder <robot>/), the controllers YAML, the world and
    the bridge YAML into `folder`."""
    model_folder = folder / config.robot
    model_folder.mkdir(parents=True, exist_ok=True)
    files = GazeboFiles(
        urdf=model_folder / "model.urdf",
        world=folder / f"{WORLD_NAME}.sdf",
        controllers=folder / f"{config.robot}_controllers.yaml",
        bridge=folder / "bridge.yaml",
    )
    files.controllers.write_text(controllers_yaml(config.robot))
    files.urdf.write_text(
        robot_urdf(config.robot, str(files.controllers.resolve()), image_size, camera_fps)
    )
    (model_folder / "model.config").write_text(MODEL_CONFIG.format(name=config.robot))
    # sdformat includes a URDF through a model folder, not as a file.
    uri = str(model_folder.resolve()) if include_robot else ""
    files.world.write_text(workcell_sdf(config, uri, image_size, camera_fps))
    files.bridge.write_text(bridge_yaml(config))
    return files


def describe_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vla-runtime describe",
        description="Write the Gazebo description of a simulated robot and its workcell: URDF "
        "(ros2_control for gz_ros2_control), controllers YAML, SDF world, ros_gz_bridge YAML.",
    )
    parser.add_argument("--robot", default="fr3", choices=sorted(FRAMES))
    parser.add_argument("--urdf", type=Path, help="write only the URDF here")
    parser.add_argument("--out", type=Path, help="folder for all four files")
    parser.add_argument("--seed", type=int, default=0, help="cube layout seed")
    parser.add_argument("--n-cubes", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--include-robot", action="store_true",
                        help="the world includes the robot (gz sim alone, no spawn)")  # fmt: skip
    args = parser.parse_args(argv)
    if not (args.urdf or args.out):
        parser.error("give --urdf FILE or --out FOLDER")
    config = SceneConfig(robot=args.robot, seed=args.seed, n_cubes=args.n_cubes)
    if args.urdf:
        controllers = args.urdf.with_name(f"{args.robot}_controllers.yaml")
        controllers.write_text(controllers_yaml(args.robot))
        args.urdf.write_text(robot_urdf(args.robot, str(controllers.resolve()), args.image_size))
        print(args.urdf)
    if args.out:
        files = write_gazebo_files(args.out, config, args.image_size,
                                   include_robot=args.include_robot)  # fmt: skip
        print("\n".join(str(p) for p in vars(files).values()))
    return 0
