"""Direct Franka driver (no ros2_control): franky-control (libfranka) behind ros2_control topics.

For hosts without franka_ros2. It offers the sim driver's interfaces, so the rest of the stack
cannot tell them apart: JTC `/<trajectory_controller>/joint_trajectory`, forward position
`/<forward_controller>/commands`, gripper `/<gripper_controller>/commands` (width in m), and
publishes `/joint_states` (arm + both fingers), `/vla/driver/events`, `/vla/driver/stats`.

A streaming thread samples the commanded motion `lookahead_s` ahead at `stream_rate_hz` of the
node's clock (sim time in a dry run on franky-sim, which may run slower than wall time) and hands
each target (position + velocity) to franky as an asynchronous JointMotion (core/franky_stream.py).
franky re-plans from the robot's current commanded state with Ruckig inside libfranka's 1 kHz
loop, within the robot's velocity/acceleration/jerk limits, so replacing the target never makes
a discontinuity. A libfranka error (a collision reflex, a limit violation, ...) is counted by
kind, latched and reported as a "reflex" event naming the kind: the arm holds where it is and no
target is sent until the operator recovers (std_srvs/Trigger on /vla/driver/recover with a
reason), which calls `recover_from_errors` and re-arms from the measured pose: the first command
must start there. Errors found at connection are latched the same way. Only the node named by
`command_source` (the safety gate) commands the arm, on the `command_interface` topic and the
gripper's (drivers/command_topics.py). The gripper runs in its own thread (core/franka_hand.py):
its calls block for up to a second, and core/gripper_intent.py decides when a width becomes one
(the same policy as the franka_ros2 gripper bridge).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from vla_runtime.core import topics
from vla_runtime.core.direct_driver import ArmCommand, Reconnector
from vla_runtime.core.franka_hand import HandWorker
from vla_runtime.core.franky_stream import REALTIME_CONFIGS, StreamConfig, StreamStats, TargetStream
from vla_runtime.core.gripper import command_refusal, opening_from_width, width_refusal
from vla_runtime.core.gripper_intent import GripperIntent, GripperIntentConfig
from vla_runtime.core.robot import load_robot
from vla_runtime.drivers.command_topics import ArmGripperControllerParams, CommandTopics
from vla_runtime.ros.diagnostics import Diagnostics
from vla_runtime.ros.messages import diagnostics_msg, joint_state_msg, to_time
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.operator_service import reasoned_trigger
from vla_runtime.ros.parameters import build, declare, joint_prefix_param, param
from vla_runtime.ros.runtime import run_node


@dataclass(frozen=True)
class FrankyDriverParams(ArmGripperControllerParams):
    robot_ip: str = param("FCI address of the arm (or franky-sim's); required", "")
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    joint_prefix: str = joint_prefix_param()
    stream_rate_hz: float = param(
        "Hz of targets handed to libfranka (1 to state_rate_hz)", StreamConfig.stream_rate_hz
    )
    state_rate_hz: float = param(
        f"Hz of reading the state, published on {topics.JOINT_STATES} (up to 1000)",
        StreamConfig.state_rate_hz,
    )
    lookahead_s: float = param(
        "s ahead of now that each target is sampled", StreamConfig.lookahead_s
    )
    relative_dynamics_factor: float = param(
        "franky's scale of the velocity, acceleration and jerk limits, in (0, 1]",
        StreamConfig.relative_dynamics_factor,
    )
    realtime_config: str = param(
        f"libfranka real-time mode, one of {REALTIME_CONFIGS}: enforce needs a real-time kernel",
        StreamConfig.realtime_config,
    )
    gripper: bool = param("drive the Franka Hand", True)
    gripper_speed: float = param("m/s of the gripper's moves and grasps", 0.05)
    gripper_force: float = param("N of a grasp", 20.0)


class FrankyDriverNode(CommandTopics, RuntimeNode):
    def __init__(self, name: str = "franky_driver", **kwargs):
        super().__init__(name, **kwargs)
        params = declare(self, FrankyDriverParams)
        robot = load_robot(params.robot, params.joint_prefix)
        self.robot_ip, self.use_gripper = params.robot_ip, params.gripper
        if not self.robot_ip:
            raise ValueError("robot_ip is required (the FCI address, or franky-sim's)")
        self.config = build(StreamConfig, params).validated()

        import franky  # imported here so that a missing franky-control is a clear node error

        self._franky = franky
        self.robot_config = robot
        self.joint_names = list(robot.joints) + list(robot.gripper_joints)
        self._lock = threading.Lock()
        self._robot = None
        self._gripper = None
        self._reconnect = Reconnector()
        self._fault: str | None = None  # the latched libfranka error kind, until recovery
        self._connect_first()
        q0 = self._measured()
        finger = robot.gripper_joints[0] if robot.gripper_joints else None
        self.command = ArmCommand(
            robot.joints, robot.position_min, robot.position_max, q0, finger,
            robot.gripper_max_width,
        )  # fmt: skip
        intent = None  # decides when a desired width becomes a gripper call
        if self.use_gripper:
            config = GripperIntentConfig(
                robot.gripper_max_width, speed=params.gripper_speed, force=params.gripper_force
            )
            intent = GripperIntent(config)
        self.hand = HandWorker(intent, robot.gripper_max_width, self._event)
        self.stats = StreamStats(self.config.stream_rate_hz)
        self._targets = TargetStream(self.config, self.stats.periods)

        self._state_pub = self.create_publisher(JointState, topics.JOINT_STATES, 10)
        self._stats_pub = self.create_publisher(DiagnosticArray, topics.DRIVER_STATS, 10)
        self.diagnostics = Diagnostics(self, self.robot_ip)
        self._subscribe_commands(params.command_topics(robot), params, self._measured)
        self.arbiter.subscribe("gripper", Float64MultiArray, self._on_gripper)
        reasoned_trigger(self, topics.DRIVER_RECOVER, self._recover)
        self.create_timer(1.0, self._publish_stats)

        self._running = True
        self._threads = [threading.Thread(target=self._stream_loop, name="stream", daemon=True)]
        if self.use_gripper:
            self._threads.append(
                threading.Thread(target=self._gripper_loop, name="gripper", daemon=True)
            )
        for thread in self._threads:
            thread.start()
        self.get_logger().info(
            f"franky driver for {robot.name} at {self.robot_ip}: streaming at "
            f"{self.config.stream_rate_hz:g} Hz, lookahead {self.config.lookahead_s * 1e3:g} ms; "
            f"commands from {self.arbiter.source.source} on "
            + ", ".join(self._topics[role] for role in self.arbiter.obeyed)
        )

    # -- connection --------------------------------------------------------------------------
    def _connect_first(self) -> None:
        """Connect, retrying refused connections with the reconnector's back-off (about a
        minute): the arm, or franky-sim started beside the stack, may still be coming up."""
        while True:
            try:
                return self._connect()
            except self._franky.NetworkException as exc:
                self._reconnect.lost(time.monotonic())
                if self._reconnect.state == "failed":
                    raise
                self.get_logger().warning(f"{self.robot_ip}: {exc}; retrying")
                time.sleep(max(0.0, self._reconnect.retry_at - time.monotonic()))

    def _connect(self) -> None:
        franky = self._franky
        config = (
            franky.RealtimeConfig.Enforce
            if self.config.realtime_config == "enforce"
            else franky.RealtimeConfig.Ignore
        )
        self._robot = franky.Robot(self.robot_ip, realtime_config=config)
        self._robot.relative_dynamics_factor = self.config.relative_dynamics_factor
        if self._robot.has_errors:  # left from before: the operator decides, as for any error
            self._fault = "errors_at_connect"
        if self.use_gripper and self._gripper is None:
            self._gripper = franky.Gripper(self.robot_ip)
        self._reconnect.connected()

    # -- streaming thread --------------------------------------------------------------------
    def _stream_loop(self) -> None:
        while self._running:
            send = self._targets.tick(time.perf_counter(), self.now_s())
            try:
                self._stream_once(send)
            except Exception as exc:  # libfranka reports failed motions on the next call
                self._targets.forget()
                self._on_robot_error(exc)
            delay = self._targets.wait_s(time.perf_counter())
            if delay > 0:
                time.sleep(delay)

    def _stream_once(self, send: bool) -> None:
        """Read and publish the state; with `send`, hand franky the next target."""
        robot = self._robot
        if robot is None:
            self._targets.forget()
            if self._reconnect.should_try(time.monotonic()):
                self._reconnect_holding(self._reconnect, self._connect, self._measured)
            return
        state = robot.current_joint_state
        q, dq = np.asarray(state.position), np.asarray(state.velocity)
        now = self.now_s()
        with self._lock:
            sample = self.command.stream_sample(now, self.config.lookahead_s)
        if sample.desired_width is not None:
            self.hand.desired_width = sample.desired_width
        if sample.tracking:
            self.stats.tracked(q, sample.desired)
        self._publish_state(now, q, dq)
        if not send or self._fault is not None or self.arbiter.fault is not None:
            return
        target = np.concatenate([sample.target, sample.target_velocity])
        if not self._targets.is_new(target):
            return
        franky = self._franky
        motion = franky.JointMotion(
            franky.JointState(sample.target, sample.target_velocity), return_when_finished=False
        )
        start = time.perf_counter()
        robot.move(motion, asynchronous=True)
        self.stats.move_calls.add(time.perf_counter() - start)
        self._targets.sent(target)

    def _on_robot_error(self, exc: Exception) -> None:
        if self._fault is None:
            kind = self.stats.libfranka_error(str(exc))
            self._fault = kind
            self.get_logger().error(
                f"libfranka error ({kind}): {exc}; holding until an operator recovery on "
                f"{topics.DRIVER_RECOVER}"
            )
            self._event("reflex", fault=kind, reason=str(exc))
        try:
            self._hold(self._measured())
        except Exception as again:  # the connection itself is gone: reconnect with back-off
            self.get_logger().error(f"reading the state failed ({again}); reconnecting")
            self._robot = None
            self._reconnect.lost(time.monotonic())

    def _recover(self, reason: str) -> tuple[bool, str]:
        """The operator's recovery: clear libfranka's errors and the latched faults, hold the
        measured pose and re-arm from it."""
        refusal = self.arbiter.clear()
        if refusal is None and self._robot is None:
            refusal = f"not connected to {self.robot_ip} ({self._reconnect.state})"
        if refusal is None:
            try:
                self._robot.recover_from_errors()
                q = self._measured()
            except Exception as exc:
                refusal = f"recover_from_errors failed: {exc}"
        if refusal is not None:
            self._event("recovery_refused", why=refusal, reason=reason)
            return False, f"recovery refused: {refusal}"
        fault, self._fault = self._fault, None
        self._targets.forget()
        self._hold(q)
        self.rearm.arm(q)
        self._event("recovered", fault=fault, reason=reason)
        return True, f"recovered from {fault}; the first command must start at the measured pose"

    def _measured(self) -> np.ndarray:
        return np.asarray(self._robot.current_joint_positions, dtype=float)

    def _publish_state(self, now: float, q: np.ndarray, dq: np.ndarray) -> None:
        fingers = [opening_from_width(self.hand.width)] * len(self.robot_config.gripper_joints)
        self._state_pub.publish(
            joint_state_msg(
                self.joint_names, to_time(now), [*q, *fingers], [*dq, *([0.0] * len(fingers))]
            )
        )

    # -- gripper thread ----------------------------------------------------------------------
    def _gripper_loop(self) -> None:
        while self._running:
            time.sleep(self.hand.step(self._gripper))

    # -- commands ----------------------------------------------------------------------------
    def _on_gripper(self, msg: Float64MultiArray) -> None:
        max_width = self.robot_config.gripper_max_width
        reason = command_refusal(msg.data) or width_refusal(float(msg.data[0]), max_width)
        if reason is None:
            self.hand.desired_width = float(msg.data[0])
        self._report("gripper", reason)

    # -- statistics --------------------------------------------------------------------------
    def report(self) -> dict:
        return self.stats.report(self.hand.calls, self.hand.width, self._reconnect.state)

    def _publish_stats(self) -> None:
        report = self.report()
        rogue = self.arbiter.fault
        fault = self._fault or (rogue["fault"] if rogue is not None else None)
        ok = report["connection"] == "connected" and fault is None
        level = DiagnosticStatus.OK if ok else DiagnosticStatus.ERROR
        values = {"libfranka_errors": report["libfranka_errors"], "fault": fault or "none"}
        stamp = self.get_clock().now().to_msg()
        name, message = f"{self.get_name()}: franky", json.dumps(report)
        self._stats_pub.publish(diagnostics_msg(name, level, message, values, stamp, self.robot_ip))
        self.diagnostics.update("arm", level, report["connection"], values)

    def close(self) -> None:
        """Stop streaming and let the robot hold; print the run's figures."""
        self._running = False
        for thread in self._threads:
            thread.join(timeout=5.0)
        if self._robot is not None:
            try:
                self._robot.stop()
                self._robot.join_motion(timeout=2.0)
            except Exception as exc:
                print(f"[{self.get_name()}] stop: {exc}", file=sys.stderr)
        print(f"[{self.get_name()}] stopped: {json.dumps(self.report())}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    return run_node(FrankyDriverNode, argv)


if __name__ == "__main__":
    sys.exit(main())
