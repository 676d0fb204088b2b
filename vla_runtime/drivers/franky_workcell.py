"""A stand-in robot and cameras for dry runs of the franka direct stack: franky-sim's FR3 in the
workcell (sim/franky_workcell.py) serving the FCI protocol, and its scene published for the sim
camera nodes: /sim/scene_xml (latched) and /sim/scene_state.

Like the sim driver it is the stack's clock: it publishes /clock (franky-sim's time, 1 ms per
tick) and stamps the scene with it, and the stack runs on sim time. franky-sim's Python control
loop takes most of a millisecond per tick, so on a busy host it runs behind wall time; the
whole stack then slows with it rather than seeing an arm that lags its commands.

    vla-runtime launch franka direct:=true franky_sim:=true policy:=true checkpoint:=DIR

starts it with the franky driver on its address and the cameras rendering its scene.

Physics ticks at 1 kHz on absolute deadlines; a tick that overruns skips the missed ones
(never a burst to catch up).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rosgraph_msgs.msg import Clock
from std_msgs.msg import Float64MultiArray, String

from vla_runtime.core import topics
from vla_runtime.ros.messages import to_time
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.parameters import declare, param
from vla_runtime.ros.qos import LATCHED, SCENE_STATE_PUBLISHER
from vla_runtime.ros.runtime import DeadlineThread, run_node
from vla_runtime.sim.franky_workcell import FrankyWorkcell

TICK_S = 0.001  # franky-sim's control period
RTF_WINDOW_S = 5.0
SLOW_RTF = 0.9


@dataclass(frozen=True)
class FrankyWorkcellParams:
    task: str = param("task of the suite whose episode layout places the cubes", "reach")
    seed: int = param("seed of the cube layout (the task's episode seed)", 0)
    hostname: str = param("loopback address to serve the FCI on; empty = the first free one", "")
    scene_state_rate_hz: float = param(f"{topics.SIM_SCENE_STATE} rate, Hz of sim time", 50.0)
    clock_rate_hz: float = param(f"{topics.CLOCK} rate, Hz of sim time (the control rate: "
                                 "sim-time timers fire on its updates)", 100.0)  # fmt: skip


class FrankyWorkcellNode(RuntimeNode):
    def __init__(self, name: str = "franky_workcell"):
        super().__init__(name)
        self.params = p = declare(self, FrankyWorkcellParams)
        for name in ("scene_state_rate_hz", "clock_rate_hz"):
            if not 0.0 < getattr(p, name) <= 1.0 / TICK_S:
                raise ValueError(f"{name} must be in (0, 1000], got {getattr(p, name)}")
        self.workcell = FrankyWorkcell(p.task, p.seed, p.hostname or None)
        self._scene_pub = self.create_publisher(
            Float64MultiArray, topics.SIM_SCENE_STATE, SCENE_STATE_PUBLISHER
        )
        self.create_publisher(String, topics.SIM_SCENE_XML, LATCHED).publish(
            String(data=self.workcell.xml)
        )
        self._clock_pub = self.create_publisher(Clock, topics.CLOCK, 10)
        self._scene_every = max(1, round(1.0 / (p.scene_state_rate_hz * TICK_S)))
        self._clock_every = max(1, round(1.0 / (p.clock_rate_hz * TICK_S)))
        self._ticks = 0
        self._msg = Float64MultiArray()
        self._clock_msg = Clock()
        self._physics = DeadlineThread(TICK_S, self._tick, name="franky-sim").start()
        self._rtf_since = (time.monotonic(), 0)
        self.create_timer(RTF_WINDOW_S, self._report_rtf)
        self.get_logger().info(
            f"franky-sim FR3 in the workcell ({p.task} layout, seed {p.seed}): using "
            f"'{self.workcell.hostname}' as the robot IP"
        )

    def _tick(self) -> None:
        self.workcell.step()
        self._ticks = ticks = self._ticks + 1
        sim_time = ticks * TICK_S
        if ticks % self._scene_every == 0:
            self._msg.data = [sim_time, *self.workcell.scene_qpos().tolist()]
            self._scene_pub.publish(self._msg)
        if ticks % self._clock_every == 0:
            self._clock_msg.clock = to_time(sim_time)
            self._clock_pub.publish(self._clock_msg)

    def _report_rtf(self) -> None:
        """Warn when physics runs behind wall time: the stack then sees a slow arm."""
        now, ticks = time.monotonic(), self._ticks
        wall0, ticks0 = self._rtf_since
        self._rtf_since = (now, ticks)
        rtf = (ticks - ticks0) * TICK_S / max(now - wall0, 1e-9)
        if rtf < SLOW_RTF:
            self.get_logger().warning(f"franky-sim runs at {rtf:.2f} x real time (the host is "
                                      "busy): so does the stack")  # fmt: skip

    def close(self) -> None:
        self._physics.stop()
        self.workcell.close()


def main(argv: list[str] | None = None) -> int:
    return run_node(FrankyWorkcellNode, argv)


if __name__ == "__main__":
    raise SystemExit(main())
