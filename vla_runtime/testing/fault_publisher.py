"""The faults that come from outside the stack, published by a bench's or a test's own node:
commands to the fault injector, bad /clock messages, garbage commands next to the streamer's,
malformed messages on every input of the safety node, an e-stop press, a second publisher on the
driver's command topic, and the operator's way out of a stop (a Trigger call with a reason)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

import numpy as np
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Empty, Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.gripper import max_opening
from vla_runtime.ros.messages import chunk_msg, to_time
from vla_runtime.ros.qos import LATCHED
from vla_runtime.testing.fault_injector import FAULT_COMMAND

PUBLISH_PERIOD_S = 0.004  # one control period between the messages of a stream of faults


class FaultPublisher:
    """Publishers on `node` for every fault it can send. `sim_now()` is the stack's sim time and
    `arm()` the arm's latest measured joint positions (the faults are built around them)."""

    def __init__(self, node, robot, sim_now: Callable[[], float], arm: Callable[[], np.ndarray]):
        self.robot, self.sim_now, self.arm = robot, sim_now, arm
        self.node = node
        self._clients = {}
        pub = node.create_publisher
        self.pubs = {
            "fault": pub(String, FAULT_COMMAND, 10),
            "clock": pub(Clock, topics.CLOCK, 10),
            "command": pub(JointState, topics.COMMAND, 100),
            "state": pub(JointState, topics.JOINT_STATES, 10),
            "chunk": pub(JointTrajectory, topics.ACTION_CHUNK, 10),
            "estop_reset": pub(Empty, topics.ESTOP_RESET, 10),
            "estop": pub(Bool, topics.ESTOP, 10),
            "scene_xml": pub(String, topics.SIM_SCENE_XML, LATCHED),
            "scene_state": pub(Float64MultiArray, topics.SIM_SCENE_STATE, 10),
            "reason": pub(String, topics.OPERATOR_REASON, LATCHED),
        }

    def press_estop(self) -> None:
        self.pubs["estop"].publish(Bool(data=True))

    def operator_call(self, service: str, reason: str, timeout_s: float = 10.0) -> tuple[bool, str]:
        """The operator's Trigger call on `service` with `reason` stated first on
        /vla/operator/reason; (success, message), or (False, why) without an answer. Needs a
        node that spins in another thread (a background recorder)."""
        client = self._clients.get(service)
        if client is None:
            client = self._clients[service] = self.node.create_client(Trigger, service)
        if not client.wait_for_service(timeout_sec=timeout_s):
            return False, f"no service {service}"
        self.pubs["reason"].publish(String(data=reason))
        time.sleep(0.1)  # the reason reaches the server before the call (separate topics)
        future = client.call_async(Trigger.Request())
        end = time.monotonic() + timeout_s
        while not future.done() and time.monotonic() < end:
            time.sleep(0.01)
        if not future.done():
            return False, f"{service}: no answer in {timeout_s:g} s"
        response = future.result()
        return bool(response.success), str(response.message)

    def rogue_commands(self, msg_type, topic: str, message, seconds: float = 0.3) -> None:
        """A second publisher on the driver's command topic `topic`, sending `message()` (the
        arm's own pose: harmless in itself) for `seconds`, then gone."""
        rogue = self.node.create_publisher(msg_type, topic, 10)
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                rogue.publish(message())
                time.sleep(PUBLISH_PERIOD_S)
        finally:
            self.node.destroy_publisher(rogue)

    def fault(self, **command) -> None:
        """A command to the fault injector (see `testing.fault_injector`)."""
        self.pubs["fault"].publish(String(data=json.dumps(command)))

    def bad_clock(self, offset_s: float, seconds: float = 0.2) -> None:
        """/clock messages `offset_s` away from the sim's, interleaved with the driver's own."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            msg = Clock()
            msg.clock = to_time(self.sim_now() + offset_s)
            self.pubs["clock"].publish(msg)
            time.sleep(PUBLISH_PERIOD_S)

    def garbage_commands(self, seconds: float = 1.0, seed: int = 0) -> None:
        """NaN/Inf, far out of range and 0.5 rad steps on /vla/command next to the streamer's."""
        rng = np.random.default_rng(seed)
        names = [*self.robot.joints, self.robot.gripper_joints[0]]
        opening = max_opening(self.robot)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            q = self.arm().copy()
            kind = rng.integers(3)
            j = rng.integers(len(q))
            q[j] = (rng.choice([math.nan, math.inf, -math.inf]), rng.choice([-10.0, 10.0]),
                    q[j] + rng.choice([-0.5, 0.5]))[kind]  # fmt: skip
            msg = JointState(name=names, position=[*map(float, q), opening])
            msg.header.stamp = to_time(self.sim_now())
            self.pubs["command"].publish(msg)
            time.sleep(PUBLISH_PERIOD_S)

    def malformed_inputs(self) -> int:
        """Malformed messages on every input of the safety node; returns how many were chunks."""
        names = [*self.robot.joints, self.robot.gripper_joints[0]]
        pubs = self.pubs
        pubs["state"].publish(JointState(name=names[:3], position=[0.0] * 3))
        pubs["state"].publish(JointState(name=names, position=[0.0] * 2))
        pubs["command"].publish(JointState(name=["x"] * 8, position=[0.0] * 8))
        pubs["command"].publish(JointState(name=names, position=[0.0]))
        pubs["scene_state"].publish(Float64MultiArray(data=[1.0, 2.0]))
        pubs["estop_reset"].publish(Empty())  # a reset with nothing latched must change nothing
        pubs["estop"].publish(Bool(data=False))

        def chunk(rows, times, joint_names=names):
            return chunk_msg(joint_names, self.sim_now(), times, rows)

        q = [*self.arm().tolist(), max_opening(self.robot)]
        bad = [
            chunk([q, [0.0], q], [0.1, 0.2, 0.3]),  # ragged
            chunk([], []),  # no points
            chunk([q] * 3, [0.1, 0.2, 0.3], [*names[:7], names[0]]),  # duplicated names
            chunk([q] * 3, [0.1, 0.3, 0.2]),  # time going backwards
            chunk([[math.nan] * 8, q, q], [0.1, 0.2, 0.3]),  # NaN
        ]
        for msg in bad:
            pubs["chunk"].publish(msg)
            time.sleep(0.05)
        return len(bad)
