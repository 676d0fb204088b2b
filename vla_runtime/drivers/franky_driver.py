"""Direct Franka driver (no ros2_control): franky-control (libfranka) behind ros2_control topics.

For hosts without franka_ros2. It offers the sim driver's interfaces, so the rest of the stack
cannot tell them apart: JTC `/<trajectory_controller>/joint_trajectory`, forward position
`/<forward_controller>/commands`, gripper `/<gripper_controller>/commands` (width in m), and
publishes `/joint_states` (arm + both fingers), `/vla/driver/events`, `/vla/driver/stats`.

A streaming thread samples the commanded motion `lookahead_s` ahead at `stream_rate_hz` and hands
each target (position + velocity) to franky as an asynchronous JointMotion. franky re-plans from
the robot's current commanded state with Ruckig inside libfranka's 1 kHz loop, within the robot's
velocity/acceleration/jerk limits, so replacing the target never makes a discontinuity. libfranka
errors are counted by kind, recovered (`recover_from_errors`) and the arm holds where it is. The
gripper runs in its own thread: its calls block for up to a second, and core/gripper_intent.py
decides when a width becomes one (the same policy as the franka_ros2 gripper bridge).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from vla_runtime.core import topics
from vla_runtime.core.direct_driver import (
    LIBFRANKA_ERROR_KINDS,
    ArmCommand,
    Reconnector,
    classify_libfranka_error,
)
from vla_runtime.core.gripper import opening_from_width, width_refusal
from vla_runtime.core.gripper_intent import GripperIntent, GripperIntentConfig
from vla_runtime.core.robot import load_robot
from vla_runtime.core.stats import Reservoir
from vla_runtime.drivers.command_topics import ArmGripperControllerParams, CommandTopics
from vla_runtime.ros.messages import to_time
from vla_runtime.ros.parameters import declare, param
from vla_runtime.ros.runtime import run_node

GRIPPER_POLL_S = 0.1
REALTIME_CONFIGS = ("enforce", "ignore")


def _milliseconds(summary: dict) -> dict:
    return {k: None if v is None else v * 1e3 for k, v in summary.items() if k != "n"}


@dataclass(frozen=True)
class FrankyDriverParams(ArmGripperControllerParams):
    robot_ip: str = param("FCI address of the arm (or franky-sim's); required", "")
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    # Every new target is a libfranka Move command (a TCP round trip and a re-plan), so
    # targets go out at stream_rate_hz while the state is read and published faster.
    stream_rate_hz: float = param("Hz of targets handed to libfranka (1 to state_rate_hz)", 50.0)
    state_rate_hz: float = param(f"Hz of reading the state, published on {topics.JOINT_STATES} "
                                 "(up to 1000)", 250.0)  # fmt: skip
    lookahead_s: float = param("s ahead of now that each target is sampled", 0.1)
    relative_dynamics_factor: float = param(
        "franky's scale of the velocity, acceleration and jerk limits, in (0, 1]", 1.0
    )
    realtime_config: str = param(f"libfranka real-time mode, one of {REALTIME_CONFIGS}: enforce "
                                 "needs a real-time kernel", "enforce")  # fmt: skip
    gripper: bool = param("drive the Franka Hand", True)
    gripper_speed: float = param("m/s of the gripper's moves and grasps", 0.05)
    gripper_force: float = param("N of a grasp", 20.0)


class FrankyDriverNode(CommandTopics, Node):
    def __init__(self, name: str = "franky_driver", **kwargs):
        super().__init__(name, **kwargs)
        params = declare(self, FrankyDriverParams)
        robot = load_robot(params.robot)
        self.robot_ip, self.realtime = params.robot_ip, params.realtime_config
        self.stream_rate, self.state_rate = params.stream_rate_hz, params.state_rate_hz
        self.lookahead, self.dynamics_factor = params.lookahead_s, params.relative_dynamics_factor
        self.use_gripper = params.gripper
        self.gripper_speed, self.gripper_force = params.gripper_speed, params.gripper_force
        if not self.robot_ip:
            raise ValueError("robot_ip is required (the FCI address, or franky-sim's)")
        if self.realtime not in REALTIME_CONFIGS:
            raise ValueError(f"realtime_config must be enforce or ignore, got {self.realtime!r}")
        if not 0.0 < self.dynamics_factor <= 1.0:
            raise ValueError(
                f"relative_dynamics_factor must be in (0, 1], got {self.dynamics_factor}"
            )
        if not 1.0 <= self.stream_rate <= self.state_rate <= 1000.0:
            raise ValueError(
                f"need 1 <= stream_rate_hz ({self.stream_rate}) <= state_rate_hz "
                f"({self.state_rate}) <= 1000"
            )
        self._ticks_per_target = max(1, round(self.state_rate / self.stream_rate))

        import franky  # imported here so that a missing franky-control is a clear node error

        self._franky = franky
        self.robot_config = robot
        self.joint_names = list(robot.joints) + list(robot.gripper_joints)
        self._lock = threading.Lock()
        self._robot = None
        self._gripper = None
        self._reconnect = Reconnector()
        self._connect()
        q0 = self._measured()
        finger = robot.gripper_joints[0] if robot.gripper_joints else None
        self.command = ArmCommand(
            robot.joints, robot.position_min, robot.position_max, q0, finger,
            robot.gripper_max_width,
        )  # fmt: skip
        self.gripper_intent = None  # decides when a desired width becomes a gripper call
        if self.use_gripper:
            self.gripper_intent = GripperIntent(
                GripperIntentConfig(
                    max_width=robot.gripper_max_width,
                    speed=self.gripper_speed,
                    force=self.gripper_force,
                )
            )
        self._desired_width: float | None = None
        self._width = robot.gripper_max_width
        self._errors = dict.fromkeys(LIBFRANKA_ERROR_KINDS, 0)
        self._periods = Reservoir()
        self._move_call = Reservoir()
        self._tracking = Reservoir()
        self._gripper_calls = {"move": 0, "grasp": 0, "failed": 0}

        self._state_pub = self.create_publisher(JointState, topics.JOINT_STATES, 10)
        self._stats_pub = self.create_publisher(DiagnosticArray, topics.DRIVER_STATS, 10)
        self._subscribe_commands(params.command_topics(robot))
        self.create_subscription(Float64MultiArray, self._topics["gripper"], self._on_gripper, 10)
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
            f"{self.stream_rate:g} Hz, lookahead {self.lookahead * 1e3:g} ms; commands on "
            + ", ".join(self._topics.values())
        )

    # -- connection --------------------------------------------------------------------------
    def _connect(self) -> None:
        franky = self._franky
        config = (
            franky.RealtimeConfig.Enforce
            if self.realtime == "enforce"
            else franky.RealtimeConfig.Ignore
        )
        self._robot = franky.Robot(self.robot_ip, realtime_config=config)
        self._robot.relative_dynamics_factor = self.dynamics_factor
        if self._robot.has_errors:
            self._robot.recover_from_errors()
        if self.use_gripper and self._gripper is None:
            self._gripper = franky.Gripper(self.robot_ip)
        self._reconnect.connected()

    # -- streaming thread --------------------------------------------------------------------
    def _stream_loop(self) -> None:
        period = 1.0 / self.state_rate
        last_sent: np.ndarray | None = None
        next_tick = time.perf_counter()
        previous_tick = None
        ticks = 0
        while self._running:
            tick = time.perf_counter()
            send = ticks % self._ticks_per_target == 0
            ticks += 1
            if send:
                if previous_tick is not None:
                    self._periods.add(tick - previous_tick)
                previous_tick = tick
            try:
                last_sent = self._stream_once(last_sent, send)
            except Exception as exc:  # libfranka reports failed motions on the next call
                last_sent = None
                self._on_robot_error(exc)
            next_tick += period
            delay = next_tick - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:  # overran: start a fresh schedule instead of bursting
                next_tick = time.perf_counter()

    def _stream_once(self, last_sent: np.ndarray | None, send: bool) -> np.ndarray | None:
        """Read and publish the state; with `send`, hand franky the next target."""
        robot = self._robot
        if robot is None:
            if self._reconnect.should_try(time.monotonic()):
                self._reconnect_holding(self._reconnect, self._connect, self._measured)
            return None
        state = robot.current_joint_state
        q, dq = np.asarray(state.position), np.asarray(state.velocity)
        now = self._now()
        with self._lock:
            # Desired now first: sampling ahead may already finish the trajectory.
            tracking = self.command.tracking(now)
            desired_now = self.command.sample(now)[0].copy()
            target_p, target_v = self.command.sample(now + self.lookahead)
            target_p, target_v = target_p.copy(), target_v.copy()
            if self.command.desired_width is not None:
                self._desired_width, self.command.desired_width = self.command.desired_width, None
        if tracking:
            self._tracking.add(float(np.max(np.abs(q - desired_now))))
        self._publish_state(now, q, dq)
        if not send:
            return last_sent
        target = np.concatenate([target_p, target_v])
        if last_sent is not None and np.array_equal(target, last_sent):
            return last_sent
        franky = self._franky
        motion = franky.JointMotion(
            franky.JointState(target_p, target_v), return_when_finished=False
        )
        start = time.perf_counter()
        robot.move(motion, asynchronous=True)
        self._move_call.add(time.perf_counter() - start)
        return target

    def _on_robot_error(self, exc: Exception) -> None:
        kind = classify_libfranka_error(str(exc))
        self._errors[kind] += 1
        self.get_logger().error(f"libfranka error ({kind}): {exc}; recovering and holding")
        self._event("libfranka_error", kind=kind, reason=str(exc))
        try:
            self._robot.recover_from_errors()
            self._hold(self._measured())
            self._event("recovered")
        except Exception as again:  # the connection itself is gone: reconnect with back-off
            self.get_logger().error(f"recovery failed ({again}); reconnecting")
            self._robot = None
            self._reconnect.lost(time.monotonic())

    def _measured(self) -> np.ndarray:
        return np.asarray(self._robot.current_joint_positions, dtype=float)

    def _publish_state(self, now: float, q: np.ndarray, dq: np.ndarray) -> None:
        msg = JointState(name=self.joint_names)
        msg.header.stamp = to_time(now)
        fingers = [opening_from_width(self._width)] * len(self.robot_config.gripper_joints)
        msg.position = [*q.tolist(), *fingers]
        msg.velocity = [*dq.tolist(), *([0.0] * len(fingers))]
        self._state_pub.publish(msg)

    # -- gripper thread ----------------------------------------------------------------------
    def _gripper_loop(self) -> None:
        next_poll = 0.0
        intent = self.gripper_intent
        while self._running:
            gripper = self._gripper
            if self._desired_width is not None:
                intent.command(self._desired_width)
            goal = intent.due(time.monotonic())
            try:
                if goal is not None:
                    token = intent.mark_sent(goal, time.monotonic())
                    self._gripper_calls[goal.action] += 1
                    try:
                        if goal.action == "grasp":
                            ok = gripper.grasp(
                                goal.width, goal.speed, goal.force,
                                epsilon_inner=goal.epsilon_inner, epsilon_outer=goal.epsilon_outer,
                            )  # fmt: skip
                        else:
                            ok = gripper.move(goal.width, goal.speed)
                    finally:
                        intent.finished(token)
                    if not ok:
                        self._gripper_calls["failed"] += 1
                        self._event("gripper_failed", action=goal.action, width=goal.width)
                    next_poll = 0.0
                if time.monotonic() >= next_poll:
                    self._width = float(gripper.width)
                    next_poll = time.monotonic() + GRIPPER_POLL_S
            except Exception as exc:
                self._gripper_calls["failed"] += 1
                self._event("gripper_failed", reason=str(exc))
                time.sleep(0.5)
            time.sleep(0.01)

    # -- commands ----------------------------------------------------------------------------
    def _on_gripper(self, msg: Float64MultiArray) -> None:
        if len(msg.data) != 1:
            reason = f"gripper command needs exactly 1 value (width in m), got {len(msg.data)}"
        else:
            reason = width_refusal(float(msg.data[0]), self.robot_config.gripper_max_width)
        if reason is None:
            self._desired_width = float(msg.data[0])
        self._report("gripper", reason)

    # -- statistics --------------------------------------------------------------------------
    def stats(self) -> dict:
        periods, moves, tracking = (
            r.summary() for r in (self._periods, self._move_call, self._tracking)
        )
        return {
            "libfranka_errors": sum(self._errors.values()),
            "libfranka_errors_by_kind": dict(self._errors),
            "stream_period_ms": _milliseconds(periods),
            "stream_period_target_ms": 1e3 / self.stream_rate,
            "move_call_ms": _milliseconds(moves),
            "tracking_error_rad": {k: v for k, v in tracking.items() if k != "n"},
            "gripper_calls": dict(self._gripper_calls),
            "gripper_width_m": self._width,
            "connection": self._reconnect.state,
        }

    def _publish_stats(self) -> None:
        stats = self.stats()
        status = DiagnosticStatus(
            name=f"{self.get_name()}: franky",
            hardware_id=self.robot_ip,
            level=DiagnosticStatus.OK
            if stats["connection"] == "connected"
            else DiagnosticStatus.ERROR,
            message=json.dumps(stats),
            values=[KeyValue(key="libfranka_errors", value=str(stats["libfranka_errors"]))],
        )
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._stats_pub.publish(msg)

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
        print(f"[{self.get_name()}] stopped: {json.dumps(self.stats())}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    return run_node(FrankyDriverNode, argv)


if __name__ == "__main__":
    sys.exit(main())
