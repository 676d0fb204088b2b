"""franky-sim's FR3 in the workcell: a libfranka-protocol arm (franky-sim's MuJoCo back end, its
own torque-level joint and hand controllers) on the workcell's table among its seeded cubes.

It stands in for a robot *and* its cameras in a dry run of the franka direct stack: franky-sim
serves the FCI protocol and simulates the cubes with the arm (a grasp squeezes with the force
the driver asks for), and `scene_qpos()` gives its state in the layout of this package's own
workcell model (`sim.scene.build_scene`), which the sim camera nodes render. Both models are
built from franky-sim's fr3.xml with the base at the origin and the table top at z = 0 (here
franky-sim's ground plane), so the calibrated cameras of calibration/sim see it as they see the
simulated workcell.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import mujoco
import numpy as np

from vla_runtime.core.robot import load_robot
from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.simulator import MODEL_FINGER_JOINTS
from vla_runtime.sim.tasks import add_zone_marker, make_setup, task_scene_config
from vla_runtime.sim.workcell import COLOURS, CUBE_FRICTION, CUBE_MASS, cube_names

ROBOT_PREFIX = "robot0_"  # franky-sim's name prefix of its first robot


class FrankyWorkcell:
    """franky-sim (one FR3, at the home pose, hand open) with the task suite's cubes where
    `task`'s episode `seed` puts them; `step()` runs one 1 ms tick of its server (commands in,
    physics, state out), paced by the caller."""

    def __init__(self, task: str = "reach", seed: int = 0, hostname: str | None = None):
        import franky_sim
        from franky_sim.mujoco_simulator import MujocoSimulator

        if task == "dynamic_reach":
            raise ValueError("franky-sim's workcell has resting cubes: no dynamic_reach")
        self.config = config = task_scene_config("fr3")
        setup = make_setup(task, seed)
        robot = load_robot(config.robot)
        self.sim = MujocoSimulator()
        self.sim.init()
        self.robot = self.sim.add_robot(
            initial_q=tuple(robot.home), initial_hand_width=robot.gripper_max_width
        )
        half = config.cube_size / 2
        for name, colour in zip(cube_names(config), config.colours, strict=False):
            yaw = setup.yaws[colour]
            quat = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
            body = ET.SubElement(self.sim.worldbody, "body", name=name,
                                 pos=_text(setup.positions[colour]), quat=_text(quat))  # fmt: skip
            ET.SubElement(body, "freejoint", name=name)
            ET.SubElement(body, "geom", name=name, type="box", size=_text([half] * 3),
                          rgba=_text(COLOURS[colour]), mass=str(CUBE_MASS),
                          friction=_text(CUBE_FRICTION))  # fmt: skip
        kwargs = {"hostname_candidates": [hostname]} if hostname else {}
        self.server = franky_sim.SimulationServer(self.sim, **kwargs)
        self.server.init()  # binds the FCI ports and compiles the scene
        self.hostname: str = self.robot.hostname
        self.xml = add_zone_marker(build_scene(config)[1])  # what the cameras render
        self._index = self._scene_qpos_index()

    def _scene_qpos_index(self) -> np.ndarray:
        """franky-sim's qpos addresses in the order of the workcell model's qpos: the arm's
        joints, both fingers, then each cube's free joint."""
        model = self.sim.model
        joints = (*load_robot(self.config.robot).joints, *MODEL_FINGER_JOINTS)
        index = [model.joint(ROBOT_PREFIX + j).qposadr[0] for j in joints]
        for name in cube_names(self.config):
            first = model.joint(name).qposadr[0]
            index.extend(range(first, first + 7))
        ours = mujoco.MjModel.from_xml_string(self.xml)
        if ours.nq != len(index):
            raise RuntimeError(f"workcell model has {ours.nq} qpos, franky-sim maps {len(index)}")
        return np.asarray(index)

    def step(self) -> None:
        self.server.run_once(realtime=False)

    def scene_qpos(self) -> np.ndarray:
        return self.sim.data.qpos[self._index].copy()

    def cube_positions(self) -> dict[str, np.ndarray]:
        qpos = self.sim.data.qpos
        model = self.sim.model
        return {name: qpos[model.joint(name).qposadr[0] : model.joint(name).qposadr[0] + 3].copy()
                for name in cube_names(self.config)}  # fmt: skip

    def close(self) -> None:
        self.server.cleanup()
        self.sim.cleanup()


def _text(values) -> str:
    return " ".join(f"{float(v):.6g}" for v in values)
