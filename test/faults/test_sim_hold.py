"""If the safety node dies, the driver side holds. The simulated arm (sim
driver in the loop, MuJoCo) is moving under the gate's commands when the safety node is killed
with SIGKILL; from /joint_states its speed must fall to ~0 within the deceleration time plus
the simulated arm's servo settling, and it must stay put while the "streamer" keeps commanding."""

from __future__ import annotations

import math
import signal
import time

import numpy as np
import pytest
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from vla_runtime.core import topics
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.audit import audit_commands, time_to_rest
from vla_runtime.stack.supervisor import NodeProcess, module_process
from vla_runtime.testing.recorder import Recorder

pytestmark = pytest.mark.integration

ROBOT = load_robot("fr3")
NAMES = [*ROBOT.joints, ROBOT.gripper_joints[0]]
WAIT_S = 120.0  # node start-up on a loaded machine
REST_SPEED = 0.02  # rad/s
SETTLE_ALLOWANCE_S = 0.4  # the simulated arm servo settling on a frozen setpoint (~0.35 s)


def start(tmp_path, name: str, module: str, *params: str) -> NodeProcess:
    log = tmp_path / f"{name}.log"
    return module_process(module, *params, log_path=log, node_name=name).start()


def stop(proc: NodeProcess) -> str:
    proc.stop(signal.SIGINT, 20.0)
    return proc.output()


class Streamer(Recorder):
    """Plays the streamer on sim time and records the arm and the driver topic (arrivals at the
    arm's latest /joint_states stamp)."""

    def __init__(self, ctx):
        super().__init__("hold_probe", context=ctx, use_sim_time=True)
        self.clock = lambda: self.sim_now
        self.states = self.record_joints(ROBOT.joints)
        self.outputs = self.record(
            Float64MultiArray, topics.forward_command("forward_position_controller"), 1000,
            lambda m: np.array(m.data),
        )  # fmt: skip
        self.command_pub = self.node.create_publisher(JointState, topics.COMMAND, 10)

    @property
    def sim_now(self) -> float:
        return self.states[-1][0] if self.states else 0.0

    def command(self, q) -> None:
        msg = JointState(name=NAMES, position=[*map(float, q), 0.04])
        msg.header.stamp = self.node.get_clock().now().to_msg()
        self.command_pub.publish(msg)

    def run_until(self, condition, path, timeout: float, what: str) -> None:
        """Spin, commanding `path(sim time)` every 4 ms of sim time, until `condition()`."""
        deadline = time.monotonic() + timeout
        next_command = 0.0
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            now = self.now()
            if path is not None and self.states and now >= next_command:
                self.command(path(now))
                next_command = now + 0.004
            self.spin(0.002)

    def speed(self, window: float = 0.05) -> float:
        recent = [dq for t, _, dq in self.states[-50:] if t >= self.sim_now - window]
        return float(np.abs(recent).max()) if recent else 0.0


def test_the_simulated_arm_stops_and_holds_when_the_safety_node_dies(rclpy_context, tmp_path):
    driver = start(tmp_path, "sim_driver", "vla_runtime.drivers.sim.node", "n_cubes:=1")
    safety = start(tmp_path, "safety", "vla_runtime.nodes.safety", "use_sim_time:=true",
                   "consequence:='off'")  # fmt: skip
    probe = Streamer(rclpy_context)
    try:
        # Commands are stamped on the probe's sim clock: it must follow /clock first, or the
        # first ones would be stamped 0 (stale to the gate) and the sway would start at 0.
        probe.run_until(
            lambda: len(probe.states) > 10 and probe.now() >= probe.states[10][0],
            None, WAIT_S, "joint states and /clock",
        )  # fmt: skip
        home = probe.states[-1][1].copy()
        amplitude = np.zeros(7)
        amplitude[[0, 5]] = 0.3
        started = [None]

        def sway(now):  # 0.3 rad at 0.5 Hz: up to 0.94 rad/s, starting where the arm is
            if started[0] is None:
                started[0] = now
            return home + amplitude * math.sin(math.pi * (now - started[0]))

        probe.run_until(lambda: len(probe.outputs) > 50 and probe.speed() > 0.6, sway,
                        WAIT_S, "the gate to arm and the arm to move fast")  # fmt: skip
        speed = probe.speed()
        safety.kill()
        killed_at = probe.sim_now
        sent = len(probe.outputs)
        probe.run_until(lambda: probe.sim_now > killed_at + 1.5, sway, WAIT_S, "1.5 s of sim")
    finally:
        probe.close()
        logs = {name: stop(proc) for name, proc in (("driver", driver), ("safety", safety))}
        print(logs["safety"][-2000:])
    # Silent: at most what was on its way at the kill (the gate's queue of 10), where a live
    # gate would have sent ~375 in the 1.5 s.
    assert len(probe.outputs) - sent <= 10, "the driver topic kept receiving commands"
    times = [t for t, _, _ in probe.states]
    velocities = [dq for _, _, dq in probe.states]
    stop_s = time_to_rest(times, velocities, killed_at, REST_SPEED, hold_s=0.5)
    bound = speed / min(ROBOT.acceleration) + SETTLE_ALLOWANCE_S
    print(f"safety killed at {speed:.2f} rad/s: arm at rest after {stop_s} s (bound {bound:.3f})")
    assert stop_s is not None and stop_s <= bound
    # Holding: after coming to rest it stays where the last gate command left it, although the
    # "streamer" kept swaying its commands.
    rest = [q for t, q, _ in probe.states if t >= killed_at + stop_s]
    assert np.abs(np.array(rest) - rest[0]).max() < 5e-3  # settling creep only
    np.testing.assert_allclose(rest[-1], probe.outputs[-1][1], atol=0.01)
    assert audit_commands([o for _, o in probe.outputs], ROBOT, 0.004).unsafe == 0
