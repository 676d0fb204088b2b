"""The collection/evaluation side of the simulated node stack, over the runtime's own topics.

`SimStack` starts the task sim driver and the sim cameras of `config/stacks/sim.yaml` as
processes on a ROS domain of its own (plus any of its policy nodes, e.g. the engine for the
lock-step evaluation) and holds an rclpy node that sees what the policy would see: camera
images, /joint_states, /sim/scene_state (the known state scripted experts and success detectors
use). `RosEnv` is the collector's environment on
top of it: each action goes out as a one-point JointTrajectory on the arm controller topic, the
instruction on /vla/instruction, and in lock-step one control period of physics per /sim/step.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String, UInt32
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.gripper import opening_from_width
from vla_runtime.core.robot import load_robot
from vla_runtime.drivers.sim.task_driver import EpisodeClient
from vla_runtime.ros.messages import chunk_msg, image_from_msg, to_seconds
from vla_runtime.ros.qos import LATCHED
from vla_runtime.ros.runtime import close_private_node, private_node
from vla_runtime.sim.env import PHYSICS_STEPS, Frame
from vla_runtime.sim.tasks import CONTROL_DT, TaskSimulator, make_setup
from vla_runtime.stack.isolation import claim_domain
from vla_runtime.stack.resolver import Stack, resolve_stack
from vla_runtime.stack.supervisor import Supervisor, node_env

STARTUP_TIMEOUT_S = 120.0
STEP_TIMEOUT_S = 20.0
# Lock-step: waited this long for a state or frame, ask for it again (it travels best effort).
REPUBLISH_S = 1.0
EPS = 1e-4  # s: stamps on the 1 ms physics grid compare within this
CLIENT_NODE = "vla_collector"  # the harness's own node


def sim_stack(
    task: str,
    image_size: int,
    lockstep: bool,
    nodes: tuple[str, ...] = (),
    arguments: dict | None = None,
    parameters: dict[str, dict] | None = None,
) -> Stack:
    """The sim stack as this harness runs it: the driver, the cameras and the policy nodes
    named in `nodes` (the harness stands in for the others). In lock-step every step batch
    ends in one scene state and one frame of it per camera; in real time the cameras render
    once per control period."""
    period_hz = 1.0 / CONTROL_DT
    timing = (
        {"camera_fps": 0.0, "scene_state_rate_hz": period_hz}
        if lockstep
        else {"camera_fps": period_hz}
    )
    # Without the safety node the harness commands the driver itself, on the trajectory
    # interface: the driver obeys only the publisher it is told to.
    source = {} if "safety" in nodes else {
        "command_source": f"/{CLIENT_NODE}", "command_interface": "trajectory",
    }  # fmt: skip
    stack = resolve_stack("sim", {
        "task": task, "lockstep": lockstep, "image_size": image_size, **timing,
        "policy": bool(nodes), **source, **(arguments or {}),
    })  # fmt: skip
    kept = [
        n for n in stack.nodes
        if n.name == "sim_driver" or n.executable == "vla-camera" or n.name in nodes
    ]  # fmt: skip
    missing = set(nodes) - {n.name for n in kept}
    if missing:
        raise ValueError(f"the sim stack has no node {sorted(missing)} with these arguments")
    parameters = parameters or {}
    kept = [replace(n, parameters={**n.parameters, **parameters.get(n.name, {})}) for n in kept]
    return replace(stack, nodes=tuple(kept))


class SimStack:
    """The processes of `stack` (a `sim_stack`), started as the launcher starts them on a ROS
    domain of their own, and a client node."""

    def __init__(self, stack: Stack, robot: str = "fr3"):
        self.stack = stack
        self.robot = load_robot(robot)
        self.cameras = tuple(
            n.parameters["camera_name"] for n in self.stack.nodes if n.executable == "vla-camera"
        )
        self.claim = claim_domain()
        self.processes = Supervisor(node_env(self.claim), "vla_stack_")
        self.node = None
        try:
            for spec in self.stack.nodes:
                self.processes.start(spec)
            self.context, self.node, self.executor = private_node(CLIENT_NODE, self.claim.domain_id)
        except BaseException:
            self.close()
            raise
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
        self.instruction_pub = node.create_publisher(String, topics.INSTRUCTION, LATCHED)
        self.step_pub = node.create_publisher(UInt32, topics.SIM_STEP, 10)
        self._joint_index: dict[str, int] | None = None
        self._setup = None

    # -- processes -------------------------------------------------------------------------
    def check_processes(self) -> None:
        for process in self.processes.dead():
            tail = "\n".join(process.tail)
            raise RuntimeError(f"node {process.name} exited with {process.returncode}:\n{tail}")

    def close(self) -> None:
        close_private_node(self)
        self.processes.close()
        self.claim.release()

    # -- subscriptions ---------------------------------------------------------------------
    def _on_image(self, camera: str, msg) -> None:
        self.images[camera] = (to_seconds(msg.header.stamp), image_from_msg(msg).copy())

    def _on_joint_state(self, msg) -> None:
        if self._joint_index is None:
            self._joint_index = {n: i for i, n in enumerate(msg.name)}
        self.joint_state = (to_seconds(msg.header.stamp), np.asarray(msg.position))

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
        self.step_pub.publish(UInt32(data=int(n)))

    def republish(self) -> None:
        """Lock-step: the driver publishes its streams again (physics stays put) and the cameras
        send their frames of that state again, for a node that subscribed after they went out
        or lost them on the way (they travel best effort)."""
        self.request_steps(0)

    def wait_republishing(self, ready, timeout_s: float, what: str) -> None:
        """`spin_until` in lock-step: `republish` every REPUBLISH_S while `ready()` is false."""
        asked = [time.monotonic()]

        def ready_or_ask() -> bool:
            if time.monotonic() - asked[0] > REPUBLISH_S:
                self.republish()
                asked[0] = time.monotonic()
            return ready()

        self.spin_until(ready_or_ask, timeout_s, what)

    def set_episode(self, seed: int) -> None:
        """New episode in the driver (a parameter service call: done when it returns)."""

        if getattr(self, "_episodes", None) is None:
            self._episodes = EpisodeClient(self.node)
        self._episodes.reset(seed, self.spin_until, STARTUP_TIMEOUT_S, STEP_TIMEOUT_S)

    def publish_instruction(self, text: str) -> None:
        self.instruction_pub.publish(String(data=text))

    def send_command(self, q, width: float) -> None:
        names = [*self.robot.joints, self.robot.gripper_joints[0]]
        row = [*map(float, q), opening_from_width(float(width))]
        self.command_pub.publish(chunk_msg(names, 0.0, [CONTROL_DT], [row]))


class RosEnv:
    """Collector environment over the node stack (lock-step by default, or real time)."""

    def __init__(
        self,
        task: str,
        image_size: int,
        realtime: bool = False,
        nodes: tuple[str, ...] = (),
        arguments: dict | None = None,
        parameters: dict[str, dict] | None = None,
    ):
        """The sim stack of `task` with the policy nodes named in `nodes` (see `sim_stack`)."""
        self.task = task
        robot = (arguments or {}).get("robot", "fr3")
        stack = sim_stack(task, image_size, not realtime, nodes, arguments, parameters)
        self.stack = SimStack(stack, robot)
        self.robot = self.stack.robot
        self.realtime = realtime
        # The expert and the detectors use the same model as the driver (built identically).
        self.model = TaskSimulator(task, robot=robot).model
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

        wait = stack.spin_until if self.realtime else stack.wait_republishing
        wait(ready, timeout_s, f"state and camera frames at t={t_target:.3f}")
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
