"""Direct UR driver (no ros2_control): ur_rtde servoJ at the controller rate behind UR topics.

For hosts without Universal_Robots_ROS2_Driver. It offers that driver's interfaces:
`/scaled_joint_trajectory_controller/joint_trajectory` (JointTrajectory),
`/forward_position_controller/commands` (Float64MultiArray), and publishes `/joint_states` with
UR joint names, `/speed_scaling_state_broadcaster/speed_scaling` (percent, like that driver),
`/vla/driver/events`.

A control thread runs ur_rtde's initPeriod/servoJ/waitPeriod loop at 500 Hz (e-Series), each
cycle sending the commanded position for now; servoJ's lookahead and gain smooth it. Protective
and emergency stops are detected from the RTDE safety status bits: the driver stops servoing and
holds the measured position, reported as a "reflex" event naming the stop. So is a servoJ that
ur_rtde refuses because its control script no longer runs (stopped from the pendant or the
dashboard, power off): "control_script_stopped". A stop cleared on the pendant resumes
nothing: motion resumes only through the operator's recovery (std_srvs/Trigger on
/vla/driver/recover with a reason), which re-uploads the control script, waits for it to run and
re-arms from the measured pose (core/command_source.py `StopLatch`, `Rearm`). Only the node named by
`command_source` (the safety gate) commands the arm, on the `command_interface` topic. A lost
connection is re-established with exponential back-off.

Tested against a UR protocol peer (vla_runtime/testing/ur_peer.py: RTDE, dashboard, script
upload and the control script's register protocol; test/integration/test_ur_rtde_peer.py), not
against URSim or an arm: a real controller's servo filter, timing and fault behaviour are not
covered. The pure parts (command conversion, servoJ parameters, stop detection, reconnect
policy) are unit-tested in test/unit/test_ur_servo.py and test/unit/test_direct_driver.py.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64

from vla_runtime.core import topics
from vla_runtime.core.command_source import StopLatch
from vla_runtime.core.direct_driver import ArmCommand, Reconnector
from vla_runtime.core.rates import STATE_RATE_HZ
from vla_runtime.core.robot import load_robot
from vla_runtime.core.speed_scaling import UR_SPEED_SCALING_TOPIC
from vla_runtime.core.ur_servo import ServoParams
from vla_runtime.drivers.command_topics import ArmControllerParams, CommandTopics
from vla_runtime.ros.diagnostics import ERROR, OK, Diagnostics
from vla_runtime.ros.messages import joint_state_msg
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.operator_service import reasoned_trigger
from vla_runtime.ros.parameters import declare, joint_prefix_param, param
from vla_runtime.ros.runtime import run_node

SCRIPT_STOPPED = "control_script_stopped"
SCRIPT_START_S = 5.0  # ur_rtde's own wait for its control script to start


@dataclass(frozen=True)
class URDriverParams(ArmControllerParams):
    robot_ip: str = param("the UR controller's address; required", "")
    robot: str = param("robot model (config/robots/<robot>.yaml)", "ur5e")
    joint_prefix: str = joint_prefix_param()
    control_rate_hz: float = param(
        "servoJ rate, Hz: 500 (e-Series) or 125 (CB3)", ServoParams.rate_hz
    )
    servo_lookahead_s: float = param(
        "servoJ lookahead, s (0.03-0.2): larger is smoother and later", ServoParams.lookahead_s
    )
    servo_gain: float = param("servoJ gain (100-2000): larger is stiffer", ServoParams.gain)
    state_rate_hz: float = param(
        f"{topics.JOINT_STATES} rate, Hz (up to control_rate_hz)", STATE_RATE_HZ
    )


class URRtdeDriverNode(CommandTopics, RuntimeNode):
    def __init__(self, name: str = "ur_driver", **kwargs):
        super().__init__(name, **kwargs)
        params = declare(self, URDriverParams)
        self.robot_ip, state_rate = params.robot_ip, params.state_rate_hz
        robot = load_robot(params.robot, params.joint_prefix)
        self.servo = ServoParams(
            params.control_rate_hz, params.servo_lookahead_s, params.servo_gain
        ).validated()
        if not self.robot_ip:
            raise ValueError("robot_ip is required (the UR controller's address)")
        if not 0.0 < state_rate <= self.servo.rate_hz:
            raise ValueError(
                f"state_rate_hz must be in (0, {self.servo.rate_hz}], got {state_rate}"
            )
        self._state_every = max(1, round(self.servo.rate_hz / state_rate))

        import rtde_control  # here, so that a missing ur-rtde is a clear node error
        import rtde_receive

        self._rtde_control, self._rtde_receive = rtde_control, rtde_receive
        self.robot_config = robot
        self._receive = rtde_receive.RTDEReceiveInterface(self.robot_ip)
        self._control = rtde_control.RTDEControlInterface(self.robot_ip, self.servo.rate_hz)
        q0 = self._measured()
        self._lock = threading.Lock()
        self.command = ArmCommand(robot.joints, robot.position_min, robot.position_max, q0)
        self.stops = StopLatch()
        self._rtde_lock = threading.Lock()  # one control cycle or one recovery at a time
        self.reconnect = Reconnector()

        self._state_pub = self.create_publisher(JointState, topics.JOINT_STATES, 10)
        self._scaling_pub = self.create_publisher(Float64, UR_SPEED_SCALING_TOPIC, 10)
        self._subscribe_commands(params.command_topics(robot), params, self._measured)
        reasoned_trigger(self, topics.DRIVER_RECOVER, self._recover)
        self.diagnostics = Diagnostics(self, self.robot_ip)
        self.diagnostics.add_check("arm", self._arm_health)
        self._running = True
        self._thread = threading.Thread(target=self._control_loop, name="servo", daemon=True)
        self._thread.start()
        self.get_logger().info(
            f"ur_rtde driver at {self.robot_ip}: servoJ {self.servo.rate_hz:g} Hz, lookahead "
            f"{self.servo.lookahead_s:g} s, gain {self.servo.gain:g}; commands from "
            f"{self.arbiter.source.source} on " + self._topics[self.arbiter.obeyed[0]]
        )

    def _arm_health(self):
        """ERROR while the RTDE link is down or a protective / emergency stop holds the arm."""
        values = {"connection": self.reconnect.state, "stop": self.stops.latched or "none"}
        if self.reconnect.state != "connected":
            return ERROR, f"RTDE {self.reconnect.state}", values
        if self.stops.latched is not None:
            return ERROR, (
                f"{self.stops.latched}: clear it on the pendant, then recover with "
                f"{topics.DRIVER_RECOVER}"
            ), values  # fmt: skip
        if self.arbiter.fault is not None:
            return ERROR, f"rogue_publisher: recover with {topics.DRIVER_RECOVER}", values
        return OK, "servoing", values

    # -- control thread ----------------------------------------------------------------------
    def _control_loop(self) -> None:
        tick = 0
        while self._running:
            if self.reconnect.state != "connected":
                self._try_reconnect()
                time.sleep(0.05)
                continue
            try:
                with self._rtde_lock:
                    start = self._control.initPeriod()
                    q = np.array(self._receive.getActualQ(), dtype=float)
                    change = self.stops.update(int(self._receive.getSafetyStatusBits()))
                    if change is not None:
                        self._on_stop_change(change, q)
                    if self.stops.may_move and self.arbiter.fault is None:
                        with self._lock:
                            target, _ = self.command.sample(self.now_s())
                        if not self._control.servoJ(*self.servo.servo_args(target)):
                            self._on_script_stopped(q)
                    if tick % self._state_every == 0:
                        self._publish_state(q)
                tick += 1
                self._control.waitPeriod(start)
            except Exception as exc:  # RTDE raises when the connection drops
                self.get_logger().error(f"RTDE connection lost: {exc}")
                self._event("disconnected", reason=str(exc))
                self.reconnect.lost(time.monotonic())

    def _on_stop_change(self, change: tuple[str, str], q: np.ndarray) -> None:
        what, reason = change
        self._hold(q)
        if what == "stopped":
            self._control.servoStop()
            self.get_logger().error(
                f"robot {reason}: servoing stopped, holding until an operator recovery on "
                f"{topics.DRIVER_RECOVER}"
            )
            self._event("reflex", fault=reason, reason=f"robot {reason}")
        else:
            self.get_logger().warning(
                f"{reason} cleared: still holding until an operator recovery on "
                f"{topics.DRIVER_RECOVER}"
            )
            self._event("stop_cleared", fault=reason)

    def _on_script_stopped(self, q: np.ndarray) -> None:
        """ur_rtde refused servoJ: its control script is not running, so nothing reaches the
        arm. Held like a stop until the operator's recovery re-uploads the script."""
        self._hold(q)
        self.stops.latched = SCRIPT_STOPPED
        self.get_logger().error(
            f"servoJ refused, the control script is not running: holding until an operator "
            f"recovery on {topics.DRIVER_RECOVER}"
        )
        self._event("reflex", fault=SCRIPT_STOPPED, reason="ur_rtde control script not running")

    def _await_script(self) -> None:
        """Until the re-uploaded control script runs: ur_rtde's reuploadScript does not wait,
        and a servoJ before it runs would be refused."""
        deadline = time.monotonic() + SCRIPT_START_S
        while not self._control.isProgramRunning():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the control script did not start within {SCRIPT_START_S} s")
            time.sleep(0.01)

    def _recover(self, reason: str) -> tuple[bool, str]:
        """The operator's recovery after a stop has cleared (or a rogue publisher left):
        re-upload the control script (a stop ends it) and re-arm from the measured pose."""
        refusal = self.arbiter.clear()
        with self._rtde_lock:
            if refusal is None and self.stops.monitor.stopped is not None:
                refusal = self.stops.recover()  # the stop is still active: says so
            if refusal is None and self.reconnect.state != "connected":
                refusal = f"RTDE {self.reconnect.state}"
            if refusal is None:
                try:
                    self._control.reuploadScript()
                    self._await_script()
                    q = self._measured()
                except Exception as exc:
                    refusal = f"re-uploading the control script failed: {exc}"
            if refusal is not None:
                self._event("recovery_refused", why=refusal, reason=reason)
                return False, f"recovery refused: {refusal}"
            self._hold(q)
            self.rearm.arm(q)
            self.stops.recover()
        self._event("recovered", reason=reason)
        return True, "recovered; the first command must start at the measured pose"

    def _try_reconnect(self) -> None:
        if self.reconnect.state == "failed" or not self.reconnect.should_try(time.monotonic()):
            return
        self._reconnect_holding(self.reconnect, self._reconnect_rtde, self._measured)

    def _reconnect_rtde(self) -> None:
        self._receive.reconnect()
        self._control.reconnect()

    def _measured(self) -> np.ndarray:
        return np.array(self._receive.getActualQ(), dtype=float)

    def _publish_state(self, q: np.ndarray) -> None:
        stamp, velocities = self.get_clock().now().to_msg(), self._receive.getActualQd()
        self._state_pub.publish(joint_state_msg(self.robot_config.joints, stamp, q, velocities))
        # As Universal_Robots_ROS2_Driver: slider x runtime scaling, in percent.
        scaling = self._receive.getSpeedScaling() * self._receive.getTargetSpeedFraction()
        self._scaling_pub.publish(Float64(data=100.0 * float(scaling)))

    # -- commands ----------------------------------------------------------------------------
    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=2.0)
        try:
            self._control.servoStop()
            self._control.stopScript()
        except Exception as exc:
            print(f"[{self.get_name()}] stop: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    return run_node(URRtdeDriverNode, argv)


if __name__ == "__main__":
    sys.exit(main())
