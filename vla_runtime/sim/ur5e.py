"""The simulated UR5e workcell: a UR5e with a parallel gripper on the same table as the FR3.

No UR model ships with any installed package, so the arm is built with mujoco.MjSpec from
Universal Robots' published standard DH parameters: every body frame is a DH frame, so the
joint angles mean exactly what they mean on the real arm (zero = arm stretched out). Links are
capsules/cylinders with the masses of ur_description's UR5e physical parameters. The gripper is
a stand-in for a Robotiq 2F-85 (85 mm stroke) wired like the franky-sim FR3 hand (actuator
"hand" on a tendon over finger_joint1/2), so `Simulator` drives both arms the same way.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from vla_runtime.core.gripper import opening_from_width
from vla_runtime.core.robot import load_robot
from vla_runtime.sim.workcell import (
    GRIPPER_ACTUATOR,
    SceneConfig,
    add_tcp_site,
    add_workcell,
    compile_scene,
    configure_hand,
    configure_spec,
)

# Standard DH (Universal Robots, UR5e): T_i = RotZ(q_i) TransZ(d_i) TransX(a_i) RotX(alpha_i).
DH_A = (0.0, -0.425, -0.3922, 0.0, 0.0, 0.0)
DH_D = (0.1625, 0.0, 0.0, 0.1333, 0.0997, 0.0996)
DH_ALPHA = (math.pi / 2, 0.0, 0.0, math.pi / 2, -math.pi / 2, 0.0)
LINKS = (
    "shoulder_link", "upper_arm_link", "forearm_link", "wrist_1_link", "wrist_2_link",
    "wrist_3_link",
)  # fmt: skip
# ur_description config/ur5e/physical_parameters.yaml (kg); base 4.0.
LINK_MASSES = (3.761, 8.058, 2.846, 1.37, 1.3, 0.365)
EFFORT_LIMITS = (150.0, 150.0, 150.0, 28.0, 28.0, 28.0)  # Nm, UR5e joint_limits.yaml
# Position servo gains (N m/rad, N m s/rad): stiff enough to track trajectories within a few
# mrad under gravity compensation, soft enough to stay stable at the 1 ms physics step.
KP = (3000.0, 3000.0, 2000.0, 800.0, 800.0, 500.0)
KV = (300.0, 300.0, 200.0, 80.0, 80.0, 50.0)
ARMATURE = (0.2, 0.2, 0.1, 0.05, 0.05, 0.05)
# The DH base frame's zero pose points the arm along -x; the base is turned half a turn so that
# the home pose reaches over the table (+x), as UR's own base_link is relative to `base`.
BASE_YAW = math.pi
BASE_HEIGHT = 0.086  # m, the fixed base cylinder under the shoulder
GRIPPER_MAX_WIDTH = 0.085  # m, Robotiq 2F-85 stroke
GRIPPER_LENGTH = 0.15  # m, flange to fingertips
TCP_OFFSET = GRIPPER_LENGTH - 0.01  # the fingertips' centre, 1 cm above their tips as the FR3's
# Contact bits: the arm and gripper touch the world (table, cubes) but not each other, since the
# capsule links overlap at the joints.
ARM_CONTYPE, ARM_CONAFFINITY = 2, 1
ARM_RGBA = (0.75, 0.78, 0.8, 1.0)
JOINT_RGBA = (0.2, 0.45, 0.7, 1.0)


def _rot_x_quat(angle: float) -> list[float]:
    return [math.cos(angle / 2), math.sin(angle / 2), 0.0, 0.0]


def _arm_geom(body, mass: float = 0.0, rgba=ARM_RGBA, **kwargs):
    return body.add_geom(
        contype=ARM_CONTYPE, conaffinity=ARM_CONAFFINITY, mass=mass, rgba=list(rgba), **kwargs
    )


def _add_arm(world, robot) -> mujoco.MjsBody:
    """The six DH links; returns the flange body (DH frame 6)."""
    cap, cyl = mujoco.mjtGeom.mjGEOM_CAPSULE, mujoco.mjtGeom.mjGEOM_CYLINDER
    base = world.add_body(
        name="ur5e_base", quat=[math.cos(BASE_YAW / 2), 0, 0, math.sin(BASE_YAW / 2)]
    )
    _arm_geom(
        base,
        type=cyl,
        size=[0.075, BASE_HEIGHT / 2, 0],
        pos=[0, 0, BASE_HEIGHT / 2],
        rgba=JOINT_RGBA,
    )
    parent, pos, quat = base, [0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]
    for i, name in enumerate(LINKS):
        body = parent.add_body(name=name, pos=pos, quat=quat)
        body.gravcomp = 1.0  # the UR controller compensates gravity, like the real arm
        body.add_joint(
            name=robot.joints[i],
            axis=[0, 0, 1],
            range=[robot.position_min[i], robot.position_max[i]],
            actfrcrange=[-EFFORT_LIMITS[i], EFFORT_LIMITS[i]],
            damping=1.0,
            armature=ARMATURE[i],
        )
        a, d = DH_A[i], DH_D[i]
        radius = 0.06 if i < 3 else 0.045
        # The joint housing: a cylinder along the joint axis (the base covers the first one,
        # which would otherwise reach into the table top).
        if i > 0:
            _arm_geom(body, type=cyl, size=[radius, 0.06, 0], rgba=JOINT_RGBA)
        if a != 0.0:  # a link along x (upper arm, forearm) carries the mass
            _arm_geom(
                body, mass=LINK_MASSES[i], type=cap, size=[radius * 0.8, 0, 0],
                fromto=[0, 0, 0, a, 0, 0],
            )  # fmt: skip
        else:  # an offset along z (shoulder, wrists)
            _arm_geom(
                body, mass=LINK_MASSES[i], type=cyl, size=[radius * 0.85, 0, 0],
                fromto=[0, 0, BASE_HEIGHT if i == 0 else 0, 0, 0, d],
            )  # fmt: skip
        parent, pos, quat = body, [a, 0.0, d], _rot_x_quat(DH_ALPHA[i])
    return parent.add_body(name="flange", pos=pos, quat=quat)


def _add_gripper(flange, spec) -> None:
    """A parallel gripper whose fingers close along the hand's y axis; approach = flange +z."""
    hand = flange.add_body(name="hand")
    hand.gravcomp = 1.0
    _arm_geom(hand, mass=0.6, type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[0.04, 0.045, 0],
              pos=[0, 0, 0.045], rgba=[0.15, 0.15, 0.15, 1])  # fmt: skip
    _arm_geom(hand, type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.02, 0.055, 0.01],
              pos=[0, 0, 0.1], rgba=[0.15, 0.15, 0.15, 1])  # fmt: skip
    finger_half = [0.01, 0.006, 0.025]
    for side, (name, sign) in enumerate((("left_finger", 1.0), ("right_finger", -1.0))):
        # Both fingers slide along their own +y, the right one turned half a turn about z.
        finger = hand.add_body(
            name=name, pos=[0, 0, GRIPPER_LENGTH - finger_half[2]],
            quat=[1, 0, 0, 0] if sign > 0 else [0, 0, 0, 1],
        )  # fmt: skip
        finger.gravcomp = 1.0
        finger.add_joint(
            name=f"finger_joint{side + 1}", type=mujoco.mjtJoint.mjJNT_SLIDE, axis=[0, 1, 0],
            range=[0.0, opening_from_width(GRIPPER_MAX_WIDTH)], damping=2.0, armature=0.01,
        )  # fmt: skip
        _arm_geom(finger, mass=0.05, type=mujoco.mjtGeom.mjGEOM_BOX, size=finger_half,
                  pos=[0, finger_half[1], 0], rgba=[0.3, 0.3, 0.3, 1],
                  friction=[1.5, 0.01, 0.001])  # fmt: skip
    add_tcp_site(hand, TCP_OFFSET)
    tendon = spec.add_tendon(name="split")
    tendon.wrap_joint("finger_joint1", 0.5)
    tendon.wrap_joint("finger_joint2", 0.5)
    spec.add_equality(
        type=mujoco.mjtEq.mjEQ_JOINT, name1="finger_joint1", name2="finger_joint2",
        objtype=mujoco.mjtObj.mjOBJ_JOINT, solimp=[0.95, 0.99, 0.001, 0.5, 2], solref=[0.005, 1],
    )  # fmt: skip


def _add_actuators(spec, robot) -> None:
    for i, joint in enumerate(robot.joints):
        act = spec.add_actuator(name=joint, target=joint, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_position(kp=KP[i], kv=KV[i])
        act.ctrlrange = [robot.position_min[i], robot.position_max[i]]
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act.forcerange = [-EFFORT_LIMITS[i], EFFORT_LIMITS[i]]
        act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
    hand = spec.add_actuator(
        name=GRIPPER_ACTUATOR, target="split", trntype=mujoco.mjtTrn.mjTRN_TENDON
    )
    configure_hand(hand, GRIPPER_MAX_WIDTH)


def build_ur5e_scene(config: SceneConfig) -> tuple[mujoco.MjModel, str]:
    """Compile the UR5e workcell; returns the model and its self-contained MJCF string."""
    robot = load_robot("ur5e")
    spec = mujoco.MjSpec()
    spec.modelname = "vla_runtime_ur5e_scene"
    spec.compiler.degree = False  # joint ranges in radians
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    configure_spec(spec, config)
    flange = _add_arm(spec.worldbody, robot)
    _add_gripper(flange, spec)
    _add_actuators(spec, robot)
    poses = add_workcell(spec, config)  # the FR3's table, cubes and camera placement
    return compile_scene(spec, list(robot.home), poses, GRIPPER_MAX_WIDTH)


def flange_pose_in_base(model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
    """4x4 pose of the flange (DH frame 6) in the arm's base frame (DH frame 0)."""

    def pose(body: str) -> np.ndarray:
        out = np.eye(4)
        out[:3, :3] = data.body(body).xmat.reshape(3, 3)
        out[:3, 3] = data.body(body).xpos
        return out

    return np.linalg.inv(pose("ur5e_base")) @ pose("flange")
