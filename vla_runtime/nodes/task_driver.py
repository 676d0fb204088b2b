"""Sim driver running one task of the suite (`python -m vla_runtime.nodes.task_driver`).

The plain sim driver plus: parameter `task` (reach, push, pick, dynamic_reach) selects the
`TaskSimulator` (zone marker, seeded layouts, the sliding cube); setting the parameter
`episode_seed` starts a new episode (home pose, open gripper, the task's layout for that seed)
without resetting sim time or republishing the scene, so /clock stays monotonic and cameras
keep their renderers. Setting a parameter is a service call: once it returns, the episode is
reset, which orders resets before the next /sim/step.
"""

from __future__ import annotations

import sys

from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter

from vla_runtime.drivers.sim.node import SimDriverNode
from vla_runtime.nodes.runtime import run_node
from vla_runtime.sim.tasks import TASKS, TaskSimulator


class TaskSimDriverNode(SimDriverNode):
    def __init__(self, name: str = "sim_driver"):
        self._task_ready = False  # declarations also pass through _on_parameters
        super().__init__(name)
        task = self.declare_parameter("task", "reach").value
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        self.declare_parameter("episode_seed", int(self.get_parameter("seed").value))
        # The base class built a plain Simulator; swap in the task's (same joints, same qpos
        # layout for the robot) before any step matters, keeping sim time monotonic.
        with self._lock:
            now = self.sim.time
            seed = int(self.get_parameter("seed").value)
            sim = TaskSimulator(task, seed, robot=self.sim.robot.name)
            sim.data.time = now
            self.sim = sim
        self._task_ready = True
        self._publish_xml()
        self._publish_all()
        self.get_logger().info(f"task {task}: {sim.setup.instruction!r}")

    def _on_parameters(self, params: list[Parameter]) -> SetParametersResult:
        if not self._task_ready:
            return super()._on_parameters(params)
        rest = []
        for param in params:
            if param.name == "episode_seed":
                if param.type_ != Parameter.Type.INTEGER:
                    return SetParametersResult(successful=False, reason="episode_seed: integer")
                with self._lock:
                    self.sim.randomize(param.value)
                self._publish_all()
            elif param.name == "task":
                return SetParametersResult(successful=False, reason="task is fixed at start-up")
            else:
                rest.append(param)
        return super()._on_parameters(rest)


def main(argv: list[str] | None = None) -> int:
    return run_node(TaskSimDriverNode, argv)


if __name__ == "__main__":
    sys.exit(main())
