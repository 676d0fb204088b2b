"""Streamer node (`vla-streamer`): checked chunks -> control-rate commands (docs/design.md §4).

Subscribes /vla/checked_chunk (JointTrajectory, docs/design.md §2 chunk convention) and
/joint_states; publishes /vla/command (sensor_msgs/JointState, header.stamp = the command time
the setpoint is for = now + driver_delay_s, plus the trajectory lookahead when the safety gate
drives a trajectory controller) at `control_rate_hz`, /vla/inference_request
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

Watchdogs (core/streaming/lifecycle.py), each reported as JSON (source "streamer") on
/vla/safety/events and each halting the plan so that the command brakes to rest at once: an
answer overdue by the engine's usual latency (asked again at once), frozen images on the
`cameras` it watches (/vla/cameras/<name>/image_raw; no requests until they are live again),
no joint state for `state_silence_s` of wall time (a dead driver stops /clock too, so sim
time cannot measure its silence), the engine reporting an attempt failed or overdue on
/vla/engine/events (asked again at once), a stage of the answer taking far longer than usual
(request -> the engine's chunk sent -> the safety node's receipt on /vla/safety/received ->
checked chunk: core/streaming/requests.py), and the engine, the safety node or the driver lost:
the liveliness lease their /vla/engine/events, /vla/checked_chunk and /vla/driver/events
publishers offer (ros/qos.py) lapsed, which DDS reports within tens of milliseconds of a
process's death. A plan that runs dry while the command moves is reported.
"""

from __future__ import annotations

import sys
import time
import zlib
from collections import deque
from dataclasses import dataclass

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.clock import Clock, ClockType
from rclpy.event_handler import QoSLivelinessChangedInfo, SubscriptionEventCallbacks
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.command_source import interface_delay_s
from vla_runtime.core.gripper import max_opening
from vla_runtime.core.robot import load_robot
from vla_runtime.core.speed_scaling import UNITS
from vla_runtime.core.streaming import metrics
from vla_runtime.core.streaming.config import MODES, REQUEST_POLICIES, StreamerConfig
from vla_runtime.core.streaming.lifecycle import (
    INFO,
    WARNING,
    Notice,
    StreamerLifecycle,
)
from vla_runtime.core.streaming.metrics import LoopTiming, format_value, stats_status
from vla_runtime.ros.diagnostics import Diagnostics
from vla_runtime.ros.messages import (
    MAX_CHUNK_BYTES,
    chunk_from_msg,
    command_msg,
    diagnostics_msg,
    event_json,
    joint_state_values,
    json_object,
    parse_request_id,
    refused_request,
    request_msg,
    to_seconds,
)
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.parameters import build, declare, joint_prefix_param, param
from vla_runtime.ros.qos import LATCHED, with_liveliness
from vla_runtime.ros.runtime import DeadlineThread, ThrottledLog, run_node

TICK_SOURCES = ("auto", "thread", "timer")
STATE_INTERVALS = 50  # recent gaps between joint states (wall time) that set the usual gap
SILENCE_GAPS = 4.0  # joint states silent for this many usual gaps count as lost
LEVELS = {
    metrics.OK: DiagnosticStatus.OK,
    metrics.WARN: DiagnosticStatus.WARN,
    metrics.ERROR: DiagnosticStatus.ERROR,
}


@dataclass(frozen=True)
class StreamerParams:
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    joint_prefix: str = joint_prefix_param()
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
    driver_delay_s: float = param("s from the arm controller's setpoint to motion (`vla-runtime "
                                  "calibrate latency`)", StreamerConfig.driver_delay_s)  # fmt: skip
    command_interface: str = param("the safety gate's (trajectory: its lookahead is led too)",
                                   "forward_position")  # fmt: skip
    trajectory_lookahead: float = param("the gate's periods to each trajectory point", 3.0)
    lead_trajectory_lookahead: bool = param("lead commands by the trajectory lookahead too", True)
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
    cameras: list = param("cameras watched for frozen images (/vla/cameras/<name>/image_raw)", [],
                          Parameter.Type.STRING_ARRAY)  # fmt: skip
    state_silence_s: float = param("s of wall time without a joint state before holding; <= 0: "
                                   "off", 0.2)  # fmt: skip


class StreamerNode(RuntimeNode):
    def __init__(self, **kwargs) -> None:
        super().__init__(kwargs.pop("node_name", "streamer"), **kwargs)
        params = declare(self, StreamerParams)
        robot = load_robot(params.robot, params.joint_prefix)
        self.control_rate_hz = params.control_rate_hz
        if not 1.0 <= self.control_rate_hz <= 2000.0:
            raise ValueError(f"control_rate_hz must be in [1, 2000], got {self.control_rate_hz}")
        period = 1.0 / self.control_rate_hz
        # Commands are for now + the whole delay to the arm, the gate's interface included.
        interface_delay = interface_delay_s(
            params.command_interface, params.trajectory_lookahead, period
        )
        arm_only = params.lead_trajectory_lookahead * interface_delay
        lead = params.driver_delay_s + arm_only
        self.config = build(StreamerConfig, params, control_period_s=period, driver_delay_s=lead,
                            arm_only_delay_s=arm_only)  # fmt: skip
        self.tick_source = params.tick_source
        if self.tick_source not in TICK_SOURCES:
            raise ValueError(f"tick_source must be one of {TICK_SOURCES}, got {self.tick_source}")
        self.speed_scaling_topic = params.speed_scaling_topic
        use_sim_time = bool(self.get_parameter("use_sim_time").value)
        if self.tick_source == "auto":
            self.tick_source = "timer" if use_sim_time else "thread"

        self.gripper_open = max_opening(robot)
        self.lifecycle = StreamerLifecycle(
            self.config, robot, self.gripper_open, params.resync_tolerance,
            self.speed_scaling_topic, params.speed_scaling_unit,
        )  # fmt: skip
        self.joint_names = self.lifecycle.joint_names
        self.timing = LoopTiming(self.config.control_period_s)
        logger = self.get_logger()
        self._warn = ThrottledLog(logger.warning)
        self._warn_scaling = ThrottledLog(logger.warning)

        self._command_pub = self.create_publisher(JointState, topics.COMMAND, 10)
        self._request_pub = self.create_publisher(JointTrajectory, topics.INFERENCE_REQUEST, 10)
        self._stats_pub = self.create_publisher(DiagnosticArray, topics.STREAMER_STATS, 10)
        self._event_pub = self.create_publisher(String, topics.SAFETY_EVENTS, 100)
        self.diagnostics = Diagnostics(self)
        self.create_bounded_subscription(JointTrajectory, topics.CHECKED_CHUNK, self._on_chunk, 10,
                                         MAX_CHUNK_BYTES, self._refuse_chunk)  # fmt: skip
        self.create_subscription(String, topics.SAFETY_EVENTS, self._on_safety_event, 100)
        self.create_subscription(String, topics.CHUNK_RECEIVED, self._on_safety_receipt, 100)
        self.create_subscription(String, topics.ENGINE_EVENTS, self._on_engine_event, 100)
        for msg_type, topic, peer in ((JointTrajectory, topics.CHECKED_CHUNK, "safety"),
                                      (String, topics.ENGINE_EVENTS, "engine"),
                                      (String, topics.DRIVER_EVENTS, "driver")):  # fmt: skip
            self._watch_liveliness(msg_type, topic, peer)
        self.create_subscription(
            JointState, topics.JOINT_STATES, self._on_joint_state, qos_profile_sensor_data
        )
        if self.speed_scaling_topic:
            self.create_subscription(Float64, self.speed_scaling_topic, self._on_speed_scaling, 10)
        self.create_subscription(String, topics.EPISODE, self._on_episode, LATCHED)
        self.create_timer(params.stats_period_s, self.publish_stats)
        for camera in params.cameras:
            self.create_subscription(Image, topics.camera_image(camera),
                                     lambda msg, camera=camera: self._on_image(camera, msg),
                                     qos_profile_sensor_data)  # fmt: skip
        self.state_silence_s = params.state_silence_s
        self._last_state_wall: float | None = None
        self._state_intervals: deque[float] = deque(maxlen=STATE_INTERVALS)
        if self.state_silence_s > 0:
            wall = Clock(clock_type=ClockType.STEADY_TIME)
            self.create_timer(min(self.state_silence_s / 2, 0.01), self._watch_states, clock=wall)

        self._thread: DeadlineThread | None = None
        if self.tick_source == "timer":
            self.create_timer(self.config.control_period_s, self.tick)
        else:
            self._thread = DeadlineThread(self.config.control_period_s, self.tick).start()
        scaling = (
            f"speed scaling from {self.speed_scaling_topic} ({params.speed_scaling_unit})"
            if self.speed_scaling_topic else "no speed scaling"
        )  # fmt: skip
        self.get_logger().info(
            f"streamer: {self.control_rate_hz:g} Hz ({self.tick_source}), mode {self.config.mode}, "
            f"requests {self.config.request_policy}, commands {1e3 * lead:.0f} ms ahead, "
            f"joints {self.joint_names}, {scaling}"
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
        step = self.lifecycle.tick(self.now_s())
        if step is None:
            return
        setpoint, request = step
        self._command_pub.publish(command_msg(self.joint_names, setpoint))
        if request is not None:
            self._request_pub.publish(request_msg(self.joint_names, request))
        self._publish_events()
        self.timing.tick_took(time.perf_counter() - started)

    def _publish_events(self) -> None:
        for event in self.lifecycle.take_events():
            self._event_pub.publish(String(data=event_json(event, "streamer")))

    def _watch_states(self) -> None:
        """Joint states silent for `state_silence_s` of wall time: hold (reported once)."""
        last = self._last_state_wall
        if last is None or not self.context.ok():
            return
        silent = time.monotonic() - last
        # A slowed simulation (or a slow driver) sends less often: silence is judged against
        # the usual gap too, so that a loaded host does not read as a lost driver.
        usual = (
            sorted(self._state_intervals)[len(self._state_intervals) // 2]
            if (self._state_intervals)
            else 0.0
        )
        if silent > max(self.state_silence_s, SILENCE_GAPS * usual):
            self._log(self.lifecycle.joint_states_silent(self.now_s(), silent))
            self._publish_events()

    # ------------------------------------------------------------------ inputs

    def _on_speed_scaling(self, msg: Float64) -> None:
        warning, note = self.lifecycle.speed_scaling(msg.data, time.monotonic())
        if warning is not None:
            self._warn_scaling(f"{self.speed_scaling_topic}: {warning}")
        if note is not None:
            self.get_logger().info(note)

    def _on_episode(self, msg: String) -> None:
        """A new episode: publish the last one's figures, then start again."""
        start = topics.episode_start(msg.data)
        if start is None:
            self._warn(f"episode message rejected: {msg.data[:200]!r}")
            return
        if self.lifecycle.started:
            self.publish_stats()
        self._log(self.lifecycle.new_episode(start))

    def _on_joint_state(self, msg: JointState) -> None:
        arm_joints, gripper_joint = self.lifecycle.arm_joints, self.lifecycle.gripper_joint
        complete = len(msg.position) >= len(msg.name)
        arm = joint_state_values(msg, arm_joints) if complete else None
        gripper = joint_state_values(msg, [gripper_joint]) if gripper_joint else None
        positions, velocities = (None, None) if arm is None else arm
        if arm is not None:
            wall = time.monotonic()
            if self._last_state_wall is not None:
                self._state_intervals.append(wall - self._last_state_wall)
            self._last_state_wall = wall
            self._log(self.lifecycle.joint_states_back())
        notice = self.lifecycle.joint_state(to_seconds(msg.header.stamp), positions, velocities,
                                            None if gripper is None else gripper[0][0])  # fmt: skip
        self._log(notice)

    def _on_chunk(self, msg: JointTrajectory) -> None:
        now = self.now_s()
        request_id = parse_request_id(msg.header.frame_id)
        self._log(self.lifecycle.chunk(now, chunk_from_msg(msg), request_id))

    def _on_image(self, camera: str, msg: Image) -> None:
        digest = zlib.crc32(msg.data)
        self._log(self.lifecycle.image(camera, to_seconds(msg.header.stamp), digest, self.now_s()))
        self._publish_events()

    def _refuse_chunk(self, reason: str) -> None:
        self._log(self.lifecycle.chunk_refused(reason))

    def _on_safety_event(self, msg: String) -> None:
        """A vetoed (or discarded) answer to the pending request: ask again at once. A stop of
        the gate: hold until it arms again."""
        request_id = refused_request(msg.data)
        if request_id is not None:
            self.lifecycle.request_refused(request_id)
            return
        kind = gate_event_kind(msg.data)
        if kind is not None:
            self._log(self.lifecycle.gate_event(kind, self.now_s()))

    def _on_engine_event(self, msg: String) -> None:
        event = json_object(msg.data)
        if event is None:
            return
        request_id = parse_request_id(str(event.get("request", "")))
        detail = str(event.get("reason", ""))[:200]
        self._log(self.lifecycle.engine_event(str(event.get("event")), request_id, detail,
                                              self.now_s()))  # fmt: skip
        self._publish_events()

    def _on_safety_receipt(self, msg: String) -> None:
        receipt = json_object(msg.data)
        if receipt is not None:
            request_id = parse_request_id(str(receipt.get("request", "")))
            self.lifecycle.milestone(request_id, "safety", self.now_s())

    def _watch_liveliness(self, msg_type, topic: str, peer: str) -> None:
        """Tell the lifecycle when the publisher `peer` on `topic` is lost or back. A second
        subscription, asking for the lease that only the runtime's own nodes offer: the one
        that takes the data keeps the default QoS, so that any publisher (a test's, a replay)
        still reaches it."""

        def changed(info: QoSLivelinessChangedInfo) -> None:
            if info.alive_count > 0:
                self._log(self.lifecycle.peer_alive(peer))
            elif info.alive_count_change < 0:
                self._log(self.lifecycle.peer_lost(peer, self.now_s()))
                self._publish_events()

        events = SubscriptionEventCallbacks(liveliness=changed, incompatible_qos=lambda _: None)
        self.create_subscription(msg_type, topic, lambda _: None, with_liveliness(1), raw=True,
                                 event_callbacks=events)  # fmt: skip

    def _log(self, notice: Notice | None) -> None:
        # One call per severity: rclpy refuses a call site that logs at two severities.
        if notice is None:
            return
        if notice.level == INFO:
            self.get_logger().info(notice.text)
        elif notice.level == WARNING:
            self.get_logger().warning(notice.text)
        else:
            self._warn(notice.text)

    # ------------------------------------------------------------------ stats

    def metrics(self) -> dict:
        overruns = 0 if self._thread is None else self._thread.overruns
        return self.lifecycle.stats(self.timing, time.monotonic(), overruns=overruns,
                                    control_rate_hz=self.control_rate_hz,
                                    tick_source=self.tick_source)  # fmt: skip

    def publish_stats(self) -> None:
        values = self.metrics()
        severity, message = stats_status(values)
        text = {key: format_value(value) for key, value in values.items()}
        self.diagnostics.update("streaming", LEVELS[severity], message, text)
        array = diagnostics_msg("streamer", LEVELS[severity], message, text,
                                self.get_clock().now().to_msg())  # fmt: skip
        try:
            self._stats_pub.publish(array)
        except Exception:  # context already shut down
            pass

    def close(self) -> None:
        if self._thread is not None:
            self._thread.stop()
        self.publish_stats()


def gate_event_kind(text: str) -> str | None:
    """The kind of a safety gate event (source "gate") from its JSON, else None."""
    event = json_object(text)
    if event is None or event.get("source") != "gate":
        return None
    kind = event.get("event")
    return kind if isinstance(kind, str) else None


def main(argv: list[str] | None = None) -> int:
    return run_node(StreamerNode, argv)


if __name__ == "__main__":
    sys.exit(main())
