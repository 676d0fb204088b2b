"""The collection/evaluation side of the simulated node stack, over the runtime's own topics.

`SimStack` starts the task sim driver and one sim camera node per camera as processes on a ROS
domain of its own (plus any extra nodes, e.g. the engine for evaluation) and holds an rclpy node
that sees what the policy would see: camera images, /joint_states, /sim/scene_state (the known
state scripted experts and success detectors use). `RosEnv` is the collector's environment on
top of it: each action goes out as a one-point JointTrajectory on the arm controller topic, the
instruction on /vla/instruction, and in lock-step one control period of physics per /sim/step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vla_runtime.core import topics
from vla_runtime.core.isolation import claim_domain
from vla_runtime.core.robot import load_robot
from vla_runtime.data.collect import CAMERAS, CONTROL_DT, PHYSICS_STEPS, Frame
from vla_runtime.nodes.process import popen_child
from vla_runtime.nodes.runtime import close_private_node, private_node
from vla_runtime.sim.tasks import TaskSimulator, make_setup

STARTUP_TIMEOUT_S = 120.0
STEP_TIMEOUT_S = 20.0
EPS = 1e-4  # s: stamps on the 1 ms physics grid compare within this


def _stamp(msg_stamp) -> float:
    return msg_stamp.sec + msg_stamp.nanosec * 1e-9


class SimStack:
    """Task sim driver + sim cameras (+ `extra_nodes`) as processes, and a client node."""

    def __init__(
        self,
        task: str,
        image_size: int,
        lockstep: bool,
        cameras=CAMERAS,
        extra_nodes: list[tuple[str, list[str]]] = (),
        log_dir: str | Path | None = None,
    ):
        from rclpy.qos import (
            DurabilityPolicy,
            QoSProfile,
            ReliabilityPolicy,
            qos_profile_sensor_data,
        )
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float64MultiArray, String, UInt32
        from trajectory_msgs.msg import JointTrajectory

        self.task, self.cameras, self.lockstep = task, tuple(cameras), lockstep
        self.robot = load_robot("fr3")
        self.claim = claim_domain()
        self.env = self.claim.env()
        self.env.setdefault("MUJOCO_GL", "egl")
        repo = str(Path(__file__).resolve().parents[2])
        self.env["PYTHONPATH"] = os.pathsep.join([repo, self.env.get("PYTHONPATH", "")])
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="vla_stack_"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: list[tuple[str, subprocess.Popen]] = []
        driver = [
            f"task:={task}", f"lockstep:={str(lockstep).lower()}", "seed:=0",
            "state_rate_hz:=250.0", "scene_state_rate_hz:=20.0",
        ]  # fmt: skip
        # Cameras render the newest scene state on a wall-clock timer; in lock-step they only
        # ever see the state at the end of each period, so every period yields one frame.
        fps = 200.0 if lockstep else 1.0 / CONTROL_DT
        try:
            self._spawn("sim_driver", "vla_runtime.nodes.task_driver", driver)
            for camera in self.cameras:
                self._spawn(
                    f"{camera}_camera", "vla_runtime.nodes.camera",
                    [f"camera_name:={camera}", "source:=sim", f"fps:={fps}",
                     f"width:={image_size}", f"height:={image_size}"],
                )  # fmt: skip
            for name, params in extra_nodes:
                module, *params = params
                self._spawn(name, module, params)

            self.context, self.node, self.executor = private_node(
                "vla_collector", self.claim.domain_id
            )
        except BaseException:
            self.close()
            raise
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self.images: dict[str, tuple[float, np.ndarray]] = {}
        self.joint_state: tuple[float, np.ndarray] | None = None
        self.scene_state: tuple[float, np.ndarray] | None = None
        node = self.node
        for camera in self.cameras:
            node.create_subscription(
                Image, topics.camera_image(camera),
                lambda msg, c=camera: self._on_image(c, msg), qos_profile_sensor_data,
            )  # fmt: skip
        node.create_subscription(JointState, topics.JOINT_STATES, self._on_joint_state, 50)
        node.create_subscription(
            Float64MultiArray, topics.SIM_SCENE_STATE, self._on_scene_state, qos_profile_sensor_data
        )
        controllers = self.robot.controllers
        self.command_pub = node.create_publisher(
            JointTrajectory, topics.trajectory_command(controllers["trajectory"]), 10
        )
        self.instruction_pub = node.create_publisher(String, topics.INSTRUCTION, latched)
        self.step_pub = node.create_publisher(UInt32, topics.SIM_STEP, 10)
        self._joint_index: dict[str, int] | None = None
        self._setup = None

    # -- processes -------------------------------------------------------------------------
    def _spawn(self, name: str, module: str, params: list[str]) -> None:
        args = [sys.executable, "-m", module, "--ros-args", "-r", f"__node:={name}"]
        for param in params:
            args += ["-p", param]
        log = (self.log_dir / f"{name}.log").open("w")
        process = popen_child(args, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((name, process))

    def check_processes(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                log = (self.log_dir / f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"node {name} exited with {process.returncode}:\n{log}")

    def close(self) -> None:
        close_private_node(self)
        for _, process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for _, process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
        self.claim.release()

    # -- subscriptions ---------------------------------------------------------------------
    def _on_image(self, camera: str, msg) -> None:
        from vla_runtime.nodes.engine import image_from_msg

        self.images[camera] = (_stamp(msg.header.stamp), image_from_msg(msg).copy())

    def _on_joint_state(self, msg) -> None:
        if self._joint_index is None:
            self._joint_index = {n: i for i, n in enumerate(msg.name)}
        self.joint_state = (_stamp(msg.header.stamp), np.asarray(msg.position))

    def _on_scene_state(self, msg) -> None:
        values = np.asarray(msg.data)
        self.scene_state = (float(values[0]), values[1:])

    def spin_until(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                self.check_processes()
                raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
            self.executor.spin_once(timeout_sec=0.01)

    # -- helpers ---------------------------------------------------------------------------
    @property
    def sim_time(self) -> float:
        return self.scene_state[0] if self.scene_state else -1.0

    def policy_state(self) -> np.ndarray:
        """7 arm joints + gripper width (sum of the fingers), as the engine node builds it."""
        index, positions = self._joint_index, self.joint_state[1]
        arm = [positions[index[j]] for j in self.robot.joints]
        width = sum(positions[index[j]] for j in self.robot.gripper_joints)
        return np.array([*arm, width], dtype=np.float32)

    def request_steps(self, n: int) -> None:
        from std_msgs.msg import UInt32

        self.step_pub.publish(UInt32(data=int(n)))

    def set_episode(self, seed: int) -> None:
        """New episode in the driver (a parameter service call: done when it returns)."""
        from vla_runtime.nodes.task_driver import EpisodeClient

        if getattr(self, "_episodes", None) is None:
            self._episodes = EpisodeClient(self.node)
        self._episodes.reset(seed, self.spin_until, STARTUP_TIMEOUT_S, STEP_TIMEOUT_S)

    def publish_instruction(self, text: str) -> None:
        from std_msgs.msg import String

        self.instruction_pub.publish(String(data=text))

    def send_command(self, q, width: float) -> None:
        from builtin_interfaces.msg import Duration
        from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

        sec, nanosec = divmod(round(CONTROL_DT * 1e9), 1_000_000_000)
        point = JointTrajectoryPoint(
            positions=[*map(float, q), float(width) / 2.0],
            time_from_start=Duration(sec=sec, nanosec=nanosec),
        )
        names = [*self.robot.joints, self.robot.gripper_joints[0]]
        self.command_pub.publish(JointTrajectory(joint_names=names, points=[point]))


class RosEnv:
    """Collector environment over the node stack (lock-step by default, or real time)."""

    def __init__(
        self, task: str, image_size: int, realtime: bool = False, log_dir=None, extra_nodes=()
    ):
        self.task = task
        self.stack = SimStack(
            task, image_size, lockstep=not realtime, extra_nodes=extra_nodes, log_dir=log_dir
        )
        self.realtime = realtime
        # The expert and the detectors use the same model as the driver (built identically).
        self.model = TaskSimulator(task).model
        self.setup = None
        try:
            self._warm_up()
        except BaseException:
            self.stack.close()
            raise

    def _warm_up(self) -> None:
        """Run periods until every camera delivers: camera processes load the scene on their
        own time, and a frame is only rendered for a state that arrives after that."""
        stack = self.stack
        asked = [0.0]

        def driver_answered() -> bool:
            if stack.scene_state is None and time.monotonic() - asked[0] > 0.5:
                stack.request_steps(0)  # (re)publish the current state; physics stays put
                asked[0] = time.monotonic()
            return stack.scene_state is not None

        stack.spin_until(driver_answered, STARTUP_TIMEOUT_S, "the driver")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                self._advance(2.0)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise

    def _wait_frame(self, t_target: float, timeout_s: float) -> Frame:
        stack = self.stack

        def ready():
            if stack.scene_state is None or stack.joint_state is None:
                return False
            fresh = stack.sim_time >= t_target - EPS and stack.joint_state[0] >= t_target - EPS
            if self.realtime:  # the newest frames of each camera, at most one period old
                fresh_images = all(
                    c in stack.images and stack.images[c][0] >= t_target - CONTROL_DT - EPS
                    for c in stack.cameras
                )
            else:  # exactly the state at the end of the period
                fresh_images = all(
                    c in stack.images and abs(stack.images[c][0] - t_target) < EPS
                    for c in stack.cameras
                )
            return fresh and fresh_images

        stack.spin_until(ready, timeout_s, f"state and camera frames at t={t_target:.3f}")
        return Frame(
            stack.sim_time,
            {c: stack.images[c][1] for c in stack.cameras},
            stack.policy_state(),
            stack.scene_state[1].copy(),
        )

    def advance(self, timeout_s: float = STEP_TIMEOUT_S) -> Frame:
        """One control period with whatever the arm was last commanded."""
        return self._advance(timeout_s)

    def _advance(self, timeout_s: float) -> Frame:
        t_target = self.stack.sim_time + CONTROL_DT
        if not self.realtime:
            # Commands and step requests travel on different topics; a short pause lets the
            # driver take the command before the period it applies to starts.
            time.sleep(0.002)
            self.stack.request_steps(PHYSICS_STEPS)
        return self._wait_frame(t_target, timeout_s)

    def reset(self, seed: int) -> Frame:
        self.setup = make_setup(self.task, seed)
        self.stack.set_episode(seed)
        self.stack.publish_instruction(self.setup.instruction)
        return self._advance(STARTUP_TIMEOUT_S)  # the first frames of the new layout

    def step(self, q, width) -> Frame:
        self.stack.send_command(q, width)
        return self._advance(STEP_TIMEOUT_S)

    def close(self) -> None:
        self.stack.close()
