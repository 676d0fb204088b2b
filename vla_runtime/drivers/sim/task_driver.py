"""Sim driver running one task of the suite (`vla-task-driver`, the sim stack's driver).

The plain sim driver plus: parameter `task` (reach, push, pick, dynamic_reach; empty = the plain
scene of the sim driver) selects the `TaskSimulator` (zone marker, seeded layouts, the sliding
cube); setting the parameter `episode_seed` starts a new episode (home pose, open gripper, the
task's layout for that seed, a latched arm fault cleared) without resetting sim time or
republishing the scene, so /clock stays monotonic and cameras keep their renderers. Setting a
parameter is a service call: once it returns, the episode is reset, which orders resets before
the next /sim/step. Each episode start is announced on /vla/episode and its instruction on
/vla/instruction (both latched), so a policy stack needs nothing else to run the task.

A reset moves the arm home under the feet of whatever was streaming to it: forward position
commands still in flight aim at the old pose. Like a real controller that only starts from the
current state, the driver ignores (and reports) what was meant for the old pose instead of
judging that stale stream as a velocity violation: trajectories stamped before the reset, and
until one command agrees with the new setpoint, forward commands and "start now" (stamp 0)
trajectories whose first point is farther than `REARM_TOLERANCE` from it.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import numpy as np
from rcl_interfaces.msg import Parameter as ParameterMsg
from rcl_interfaces.msg import ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.command_source import REARM_TOLERANCE
from vla_runtime.drivers.sim.node import SimDriverNode, SimDriverParams
from vla_runtime.ros.messages import chunk_from_msg
from vla_runtime.ros.parameters import param
from vla_runtime.ros.qos import LATCHED
from vla_runtime.ros.runtime import run_node
from vla_runtime.sim.tasks import TASKS, TaskSimulator


class EpisodeClient:
    """Starts episodes in a running task driver: sets its `episode_seed` parameter (a service
    call; the episode is reset when it returns). `spin_until(ready, timeout_s, what)` is the
    caller's spin loop."""

    def __init__(self, node, driver: str = "sim_driver"):
        self._client = node.create_client(SetParameters, f"/{driver}/set_parameters")

    def reset(self, seed: int, spin_until, ready_timeout_s: float, call_timeout_s: float):
        spin_until(self._client.service_is_ready, ready_timeout_s, "the sim driver")
        value = ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=int(seed))
        request = SetParameters.Request(parameters=[ParameterMsg(name="episode_seed", value=value)])
        future = self._client.call_async(request)
        spin_until(future.done, call_timeout_s, "the episode reset")
        result = future.result().results[0]
        if not result.successful:
            raise RuntimeError(f"episode reset refused: {result.reason}")


@dataclass(frozen=True)
class TaskDriverParams(SimDriverParams):
    task: str = param(f"task of the suite, one of {TASKS}; empty = the plain scene", "reach")
    episode_seed: int | None = param(
        "set to start a new episode laid out with this seed; unset at start (seed lays out the "
        "first)",
        None,
        Parameter.Type.INTEGER,
    )


class TaskSimDriverNode(SimDriverNode):
    Params = TaskDriverParams

    def __init__(self, name: str = "sim_driver"):
        self._task_ready = False  # until the task's simulator runs (never in the plain scene)
        super().__init__(name)
        task = self.params.task
        if task and task not in TASKS:
            raise ValueError(f"task must be one of {TASKS} (or empty), got {task!r}")
        self.task = task
        self._episode = 0
        self._rearm_pending = False
        self._episode_stamp = -math.inf  # sim time of the last reset
        self._ignored = 0
        if not task:  # the plain scene: nothing to add
            return
        self._episode_pub = self.create_publisher(String, topics.EPISODE, LATCHED)
        self._instruction_pub = self.create_publisher(String, topics.INSTRUCTION, LATCHED)
        # The base class built a plain Simulator; swap in the task's (same joints, same qpos
        # layout for the robot) before any step matters, keeping sim time monotonic.
        with self._lock:
            now, seed = self.sim.time, self.params.seed
            sim = TaskSimulator(
                task,
                seed,
                robot=self.sim.robot.name,
                servo_feedforward=self.params.servo_feedforward,
            )
            sim.data.time = now
            self.sim = sim
        self._task_ready = True
        self._publish_xml()
        self._publish_all()
        self._announce(seed)
        self.get_logger().info(f"task {task}: {sim.setup.instruction!r}")

    def _announce(self, seed: int) -> None:
        setup = self.sim.setup
        self._episode += 1
        episode = {
            "episode": self._episode,
            "seed": int(seed),
            "task": self.task,
            "instruction": setup.instruction,
            "stamp": self.sim.time,
            "arm_moved": True,  # the reset put the arm at home at once
        }
        self._instruction_pub.publish(String(data=setup.instruction))
        self._episode_pub.publish(String(data=json.dumps(episode)))

    def _from_before_reset(self, arm, topic: str) -> bool:
        """While re-arming after a reset: whether `arm` (a commanded target) is far from the
        new setpoint, i.e. meant for the old pose (then ignored and reported)."""
        if not self._rearm_pending:
            return False
        with self._lock:
            setpoint = self.sim.setpoint
        arm = np.asarray(arm, dtype=float)
        if arm.shape != setpoint.shape or np.abs(arm - setpoint).max() <= REARM_TOLERANCE:
            self._rearm_pending = False  # malformed ones are judged (and refused) as usual
            return False
        self._report_ignored(topic)
        return True

    def _report_ignored(self, topic: str) -> None:
        self._ignored += 1
        if self._ignored == 1 or self._ignored % 250 == 0:
            event = {
                "event": "ignored",
                "topic": topic,
                "count": self._ignored,
                "reason": "command from before the episode reset",
                "stamp": self.sim.time,
            }
            self._publish_event(event)

    def _on_forward(self, msg: Float64MultiArray) -> None:
        if not self._from_before_reset(msg.data, "forward"):
            super()._on_forward(msg)

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        chunk = chunk_from_msg(msg)
        if chunk.stamp > 0.0:  # a stamped trajectory says itself when it was meant for
            if chunk.stamp < self._episode_stamp:
                self._report_ignored("trajectory")
            else:
                self._rearm_pending = False
                super()._on_trajectory(msg)
            return
        arm_joints, names = self.robot.joints, chunk.joint_names  # as on ROS
        start = None  # "start now": its first point says which pose it starts from
        if chunk.positions and all(j in names for j in arm_joints):
            first = chunk.positions[0]
            if len(first) == len(names):
                start = [first[names.index(j)] for j in arm_joints]
        if start is None or not self._from_before_reset(start, "trajectory"):
            super()._on_trajectory(msg)

    def _set_at_run_time(self, parameter: Parameter) -> str | None:
        if not self._task_ready or parameter.name not in ("episode_seed", "task"):
            return super()._set_at_run_time(parameter)
        if parameter.name == "task":
            return "task is fixed at start-up"
        if parameter.type_ != Parameter.Type.INTEGER:
            return "episode_seed: integer"
        with self._lock:
            self.sim.randomize(parameter.value)
            # One step on: no state from before the reset shares a stamp with one after.
            self.sim.data.time += self.sim.dt
            self._rearm_pending = True
            self._episode_stamp = self.sim.time
        self._publish_all()
        self._announce(parameter.value)
        return None


def main(argv: list[str] | None = None) -> int:
    return run_node(TaskSimDriverNode, argv)


if __name__ == "__main__":
    sys.exit(main())
