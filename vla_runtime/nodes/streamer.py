"""Streamer node (`vla-streamer`): checked chunks -> control-rate commands (docs/design.md §4).

Subscribes /vla/checked_chunk (JointTrajectory, docs/design.md §2 chunk convention) and
/joint_states; publishes /vla/command (sensor_msgs/JointState, header.stamp = the command time
the setpoint is for = now + driver_delay_s) at `control_rate_hz`, /vla/inference_request
(JointTrajectory: the plan still to run, header.stamp = now, points relative to it,
header.frame_id = "req:<id>", which the engine echoes in the chunk's frame_id so the delay can
be counted in control steps) and /vla/streamer/stats (DiagnosticArray, every `stats_period_s`).

It never commands before the first joint state with every arm joint has arrived; it then holds
that measured state until a chunk arrives. Bad chunks are logged and rejected (the arm keeps
its plan or holds). Tick source (`tick_source`): "thread" = a dedicated thread sleeping to
absolute CLOCK_MONOTONIC deadlines (clock_nanosleep, lowest jitter, wall time); "timer" = a ROS
timer on the node's clock (follows /clock with use_sim_time); "auto" = timer with sim time,
thread otherwise.

Speed scaling (`speed_scaling_topic`, empty = off; the UR stack sets
/speed_scaling_state_broadcaster/speed_scaling): std_msgs/Float64 in `speed_scaling_unit`
("percent", what Universal_Robots_ROS2_Driver publishes, or "fraction"). The plan then runs at
s x real time like UR's scaled_joint_trajectory_controller, and s = 0 pauses it
(core/streaming/streamer.py). With a topic set, streaming starts only once a first valid
reading has arrived (the plan's speed is unknown before); a silent source keeps its last value
(core/speed_scaling.py), `speed_scaling_age_s` in the stats shows a stale one. Non-finite
readings are ignored, out-of-range ones clamped to [0, 1], each with a (throttled) warning.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.gripper import max_opening
from vla_runtime.core.interpolation import limits_for
from vla_runtime.core.robot import load_robot
from vla_runtime.core.speed_scaling import UNITS, SpeedScalingInput
from vla_runtime.core.streaming import metrics
from vla_runtime.core.streaming.config import MODES, REQUEST_POLICIES, StreamerConfig
from vla_runtime.core.streaming.metrics import LoopTiming, format_value, stats_status
from vla_runtime.core.streaming.streamer import ActionStreamer, chunk_in_joint_order
from vla_runtime.ros.messages import (
    chunk_from_msg,
    command_msg,
    joint_state_values,
    parse_request_id,
    refused_request,
    request_msg,
    to_seconds,
)
from vla_runtime.ros.parameters import build, declare, param
from vla_runtime.ros.qos import LATCHED
from vla_runtime.ros.runtime import DeadlineThread, ThrottledLog, run_node

TICK_SOURCES = ("auto", "thread", "timer")
LEVELS = {
    metrics.OK: DiagnosticStatus.OK,
    metrics.WARN: DiagnosticStatus.WARN,
    metrics.ERROR: DiagnosticStatus.ERROR,
}


@dataclass(frozen=True)
class StreamerParams:
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    control_rate_hz: float = param(
        "command rate, Hz (1-2000)", 1.0 / StreamerConfig.control_period_s
    )
    mode: str = param(
        f"one of {MODES}: overlapped inference or wait-then-execute", StreamerConfig.mode
    )
    request_policy: str = param(f"one of {REQUEST_POLICIES}", StreamerConfig.request_policy)
    margin_steps: int = param("control steps of plan beyond the expected delay when asking",
                              StreamerConfig.margin_steps)  # fmt: skip
    blend_window_s: float = param("s over which a new chunk takes over the plan",
                                  StreamerConfig.blend_window_s)  # fmt: skip
    driver_delay_s: float = param("s from command to motion (the setpoint is for now + it)",
                                  StreamerConfig.driver_delay_s)  # fmt: skip
    warmup_requests: int = param("requests before the delay estimate is trusted",
                                 StreamerConfig.warmup_requests)  # fmt: skip
    request_timeout_s: float = param("s without an answer before asking again",
                                     StreamerConfig.request_timeout_s)  # fmt: skip
    tick_source: str = param(f"one of {TICK_SOURCES}: auto = timer on sim time, else thread",
                             "auto")  # fmt: skip
    stats_period_s: float = param("s between /vla/streamer/stats", 1.0)
    # Held command vs measured arm: beyond this (rad) the held command moves to the arm, so a
    # safety gate that stopped the arm can re-arm (its start tolerance is 0.05 rad).
    resync_tolerance: float = param("rad between a held command and the arm before it resyncs",
                                    0.03)  # fmt: skip
    speed_scaling_topic: str = param("std_msgs/Float64 speed scaling to follow; empty = none", "")
    speed_scaling_unit: str = param(f"one of {sorted(UNITS)}", "percent")


class StreamerNode(Node):
    def __init__(self, **kwargs) -> None:
        super().__init__(kwargs.pop("node_name", "streamer"), **kwargs)
        params = declare(self, StreamerParams)
        robot = load_robot(params.robot)
        self.control_rate_hz = params.control_rate_hz
        if not 1.0 <= self.control_rate_hz <= 2000.0:
            raise ValueError(f"control_rate_hz must be in [1, 2000], got {self.control_rate_hz}")
        self.config = build(StreamerConfig, params, control_period_s=1.0 / self.control_rate_hz)
        self.tick_source = params.tick_source
        if self.tick_source not in TICK_SOURCES:
            raise ValueError(f"tick_source must be one of {TICK_SOURCES}, got {self.tick_source}")
        stats_period_s = params.stats_period_s
        self.resync_tolerance = params.resync_tolerance
        self.speed_scaling_topic = params.speed_scaling_topic
        self.speed_scaling_unit = params.speed_scaling_unit
        self._speed = SpeedScalingInput(self.speed_scaling_unit)
        use_sim_time = bool(self.get_parameter("use_sim_time").value)
        if self.tick_source == "auto":
            self.tick_source = "timer" if use_sim_time else "thread"

        self.arm_joints = list(robot.joints)
        self.gripper_joint = robot.gripper_joints[0] if robot.gripper_joints else None
        self.joint_names = self.arm_joints + ([self.gripper_joint] if self.gripper_joint else [])
        self.limits = limits_for(robot, with_gripper=self.gripper_joint is not None)
        self.gripper_open = max_opening(robot)

        self.streamer: ActionStreamer | None = None
        self._lock = threading.Lock()
        self.timing = LoopTiming(self.config.control_period_s)
        self._warn = ThrottledLog(self.get_logger().warning)
        self._warn_scaling = ThrottledLog(self.get_logger().warning)
        self._episode = 0  # episodes announced on /vla/episode so far
        self._episode_start = -math.inf  # joint states and chunks before it are the old scene

        self._command_pub = self.create_publisher(JointState, topics.COMMAND, 10)
        self._request_pub = self.create_publisher(JointTrajectory, topics.INFERENCE_REQUEST, 10)
        self._stats_pub = self.create_publisher(DiagnosticArray, topics.STREAMER_STATS, 10)
        self.create_subscription(JointTrajectory, topics.CHECKED_CHUNK, self._on_chunk, 10)
        self.create_subscription(String, topics.SAFETY_EVENTS, self._on_safety_event, 100)
        self.create_subscription(
            JointState, topics.JOINT_STATES, self._on_joint_state, qos_profile_sensor_data
        )
        if self.speed_scaling_topic:
            self.create_subscription(Float64, self.speed_scaling_topic, self._on_speed_scaling, 10)
        self.create_subscription(String, topics.EPISODE, self._on_episode, LATCHED)
        self.create_timer(stats_period_s, self.publish_stats)

        self._thread: DeadlineThread | None = None
        if self.tick_source == "timer":
            self.create_timer(self.config.control_period_s, self.tick)
        else:
            self._thread = DeadlineThread(self.config.control_period_s, self.tick).start()
        scaling = (
            f"speed scaling from {self.speed_scaling_topic} ({self.speed_scaling_unit})"
            if self.speed_scaling_topic else "no speed scaling"
        )  # fmt: skip
        self.get_logger().info(
            f"streamer: {self.control_rate_hz:g} Hz ({self.tick_source}), mode {self.config.mode}, "
            f"requests {self.config.request_policy}, joints {self.joint_names}, {scaling}"
        )

    # ------------------------------------------------------------------ control loop

    def tick(self) -> None:
        """One control step: advance the plan, publish the command and maybe a request."""
        started = time.perf_counter()
        # Period deviation on the ROS clock when ticking on a sim-time timer, else wall time.
        if self.tick_source == "timer" and self.get_clock().ros_time_is_active:
            self.timing.tick_started(self.get_clock().now().nanoseconds)
        else:
            self.timing.tick_started(time.monotonic_ns())
        now = self._now()
        with self._lock:
            streamer = self.streamer
            if streamer is None:
                return
            setpoint = streamer.tick(now)
            request = streamer.make_request(now) if streamer.want_request(now) else None
        self._command_pub.publish(command_msg(self.joint_names, setpoint))
        if request is not None:
            self._request_pub.publish(request_msg(self.joint_names, request))
        self.timing.tick_took(time.perf_counter() - started)

    # ------------------------------------------------------------------ inputs

    def _on_speed_scaling(self, msg: Float64) -> None:
        with self._lock:
            fraction, warning, note = self._speed.read(msg.data, time.monotonic())
            if fraction is not None and self.streamer is not None:
                self.streamer.set_speed_scaling(fraction)
        if warning is not None:
            self._warn_scaling(f"{self.speed_scaling_topic}: {warning}")
        if note is not None:
            self.get_logger().info(note)

    def _on_episode(self, msg: String) -> None:
        """A new episode: publish the last one's figures, then start again from the first
        joint state measured after the reset (the arm was moved by the reset, not by us)."""
        start = topics.episode_start(msg.data)
        if start is None:
            self._warn(f"episode message rejected: {msg.data[:200]!r}")
            return
        if self.streamer is not None:
            self.publish_stats()
        with self._lock:
            self._episode += 1
            self._episode_start = start
            self.streamer = None
        self.get_logger().info(f"episode {self._episode} from t={start:.3f}: restarting")

    def _on_joint_state(self, msg: JointState) -> None:
        if to_seconds(msg.header.stamp) < self._episode_start:
            return  # measured before the reset
        complete = len(msg.position) >= len(msg.name)
        arm = joint_state_values(msg, self.arm_joints) if complete else None
        if self.streamer is not None:
            # Commands follow the plan open loop; only a held command is brought to the arm.
            if arm is not None and arm[1] is not None and all(map(math.isfinite, arm[0] + arm[1])):
                with self._lock:
                    resynced = self.streamer.resync(arm[0], arm[1], self.resync_tolerance)
                if resynced:
                    self.get_logger().warning("held command moved to the measured arm")
            return
        if arm is None:
            self._warn(f"joint state lacks arm joints {self.arm_joints}; not starting yet")
            return
        position = arm[0]
        if self.gripper_joint is not None:
            gripper = joint_state_values(msg, [self.gripper_joint])
            position.append(self.gripper_open if gripper is None else gripper[0][0])
        if not all(math.isfinite(p) for p in position):
            self._warn(f"non-finite joint state {position}; not starting yet")
            return
        if self.speed_scaling_topic and self._speed.fraction is None:
            self._warn(
                f"no speed scaling on {self.speed_scaling_topic} yet; not starting (set "
                "speed_scaling_topic:='' to stream without it)"
            )
            return
        with self._lock:
            self.streamer = ActionStreamer(
                self.config, self.limits, np.array(position), arm_dof=len(self.arm_joints)
            )
            if self._speed.fraction is not None:
                self.streamer.set_speed_scaling(self._speed.fraction)
        self.get_logger().info(f"holding the measured state {np.round(position, 4).tolist()}")

    def _on_chunk(self, msg: JointTrajectory) -> None:
        now = self._now()
        if self.streamer is None:
            self._warn("chunk before the first joint state: ignored")
            return
        if to_seconds(msg.header.stamp) < self._episode_start:
            parsed = "observed before the episode started"
        else:
            with self._lock:
                held_gripper = float(self.streamer.state.position[-1])
            parsed = chunk_in_joint_order(
                chunk_from_msg(msg), self.arm_joints, self.joint_names, held_gripper
            )
        if isinstance(parsed, str):
            with self._lock:
                self.streamer.reject_chunk(parsed)
            self._warn(f"chunk rejected: {parsed}")
            return
        times, positions = parsed
        with self._lock:
            result = self.streamer.merge_chunk(
                now, to_seconds(msg.header.stamp), times, positions,
                parse_request_id(msg.header.frame_id),
            )  # fmt: skip
        if not result.accepted:
            self._warn(f"chunk rejected: {result.reason}")

    def _on_safety_event(self, msg: String) -> None:
        """A vetoed (or discarded) answer to the pending request: ask again at once."""
        request_id = refused_request(msg.data)
        if request_id is not None and self.streamer is not None:
            with self._lock:
                self.streamer.request_refused(request_id)

    # ------------------------------------------------------------------ stats

    def metrics(self) -> dict:
        with self._lock:
            figures = None if self.streamer is None else metrics.streamer_metrics(self.streamer)
        return metrics.streamer_stats(
            figures,
            self.timing,
            speed_scaling_topic=self.speed_scaling_topic,
            speed_scaling_age_s=self._speed.age(time.monotonic()),
            speed_scaling_rejected=self._speed.rejected,
            mode=self.config.mode,
            request_policy=self.config.request_policy,
            control_rate_hz=self.control_rate_hz,
            tick_source=self.tick_source,
            overruns=0 if self._thread is None else self._thread.overruns,
            episode=self._episode,
        )

    def publish_stats(self) -> None:
        values = self.metrics()
        severity, message = stats_status(values)
        status = DiagnosticStatus(
            level=LEVELS[severity],
            name="streamer",
            message=message,
            values=[KeyValue(key=k, value=format_value(v)) for k, v in values.items()],
        )
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        try:
            self._stats_pub.publish(array)
        except Exception:  # context already shut down
            pass

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def close(self) -> None:
        if self._thread is not None:
            self._thread.stop()
        self.publish_stats()


def main(argv: list[str] | None = None) -> int:
    return run_node(StreamerNode, argv)


if __name__ == "__main__":
    sys.exit(main())
