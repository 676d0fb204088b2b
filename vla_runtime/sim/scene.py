"""The simulated scene of a robot: its arm model on the shared workcell (`sim.workcell`).

Built with mujoco.MjSpec; the FR3 model ships with franky-sim, the UR5e's is built from its
DH parameters (`sim.ur5e`). The returned XML is self-contained (absolute mesh directory), so
camera processes rebuild the identical model from the string the driver publishes.
"""

from __future__ import annotations

from pathlib import Path

import mujoco

from vla_runtime.core.robot import SIMULATED_ROBOTS, load_robot
from vla_runtime.sim.ur5e import build_ur5e_scene
from vla_runtime.sim.workcell import (
    GRIPPER_ACTUATOR,
    SceneConfig,
    add_tcp_site,
    add_workcell,
    compile_scene,
    configure_hand,
    configure_spec,
)


def franky_fr3_assets() -> Path:
    import franky_sim

    return Path(franky_sim.__file__).resolve().parent / "assets"


FR3_TCP_OFFSET = 0.1034  # m: franka_description's fr3_hand_tcp, the Franka Hand's fingertip centre


def build_scene(config: SceneConfig = SceneConfig()) -> tuple[mujoco.MjModel, str]:
    """Compile the scene; returns the model and its self-contained MJCF string."""
    if config.robot == "ur5e":
        return build_ur5e_scene(config)
    if config.robot != "fr3":
        raise ValueError(
            f"no simulated model for robot {config.robot!r} (only {', '.join(SIMULATED_ROBOTS)})"
        )
    robot = load_robot(config.robot)
    assets = franky_fr3_assets()
    spec = mujoco.MjSpec.from_file(str(assets / "fr3.xml"))
    spec.meshdir = str(assets / "meshes")  # the shipped meshdir="assets" is wrong
    spec.modelname = "vla_runtime_fr3_scene"
    configure_spec(spec, config)
    # The shipped finger friction (1.137 N) exceeds the gripper's spring force near closing, so
    # the fingers stalled ~2 cm from a width setpoint; without it they settle on the setpoint.
    for finger in ("finger_joint1", "finger_joint2"):
        spec.joint(finger).frictionloss = 0.0
    configure_hand(spec.actuator(GRIPPER_ACTUATOR), robot.gripper_max_width)
    add_tcp_site(spec.body("hand"), FR3_TCP_OFFSET)
    # Like the real FR3, whose controller always compensates gravity: without it the position
    # actuators sag by up to ~0.01 rad under the arm's weight.
    for body in spec.body("fr3_link1").find_all(mujoco.mjtObj.mjOBJ_BODY):
        body.gravcomp = 1.0
    spec.body("fr3_link1").gravcomp = 1.0
    poses = add_workcell(spec, config)
    # The shipped keyframe only covers the bare arm; replace it with our home state.
    for key in list(spec.keys):
        spec.delete(key)
    return compile_scene(spec, list(robot.home), poses, robot.gripper_max_width)
