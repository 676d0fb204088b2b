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
s x real time like UR's scaled_joint_trajectory_controller, and s = 0 pauses it (core/streaming.py).
With a topic set, streaming starts only once a first valid reading has arrived (the plan's speed
is unknown before). A source that goes silent keeps its last value: the UR driver only stops
publishing when its controller manager stops, and falling back to 100 % would run the plan
ahead of a slowed arm, to 0 would freeze it on a DDS hiccup; `speed_scaling_age_s` in the stats
shows a stale reading. Non-finite readings are ignored, out-of-range ones clamped to [0, 1],
each with a (throttled) warning.
"""

from __future__ import annotations

import ctypes
import json
import math
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.gripper import max_opening
from vla_runtime.core.interpolation import limits_for
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.chunk_check import STALE, VETO
from vla_runtime.core.speed_scaling import UNITS, speed_fraction
from vla_runtime.core.stats import Reservoir
from vla_runtime.core.streaming import MODES, REQUEST_POLICIES, ActionStreamer, StreamerConfig
from vla_runtime.ros.messages import chunk_from_msg, chunk_msg, to_seconds
from vla_runtime.ros.parameters import build, declare, param
from vla_runtime.ros.qos import LATCHED
from vla_runtime.ros.runtime import ThrottledLog, run_node

TICK_SOURCES = ("auto", "thread", "timer")
REQUEST_PREFIX = "req:"
CLOCK_MONOTONIC, TIMER_ABSTIME = 1, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _absolute_sleeper():
    """sleep_until(deadline_ns on CLOCK_MONOTONIC): clock_nanosleep(TIMER_ABSTIME) through libc
    (no drift from computing relative sleeps), or time.sleep where libc lacks it."""
    try:
        clock_nanosleep = ctypes.CDLL(None, use_errno=True).clock_nanosleep
    except (OSError, AttributeError):
        clock_nanosleep = None

    def sleep_until(deadline_ns: int) -> None:
        if clock_nanosleep is None:
            delay = (deadline_ns - time.monotonic_ns()) * 1e-9
            if delay > 0:
                time.sleep(delay)
            return
        spec = _Timespec(deadline_ns // 1_000_000_000, deadline_ns % 1_000_000_000)
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ctypes.byref(spec), None) == 4:
            pass  # EINTR: a signal arrived; sleep on to the same deadline

    return sleep_until


def refused_request(event: str) -> int | None:
    """The request id a safety chunk verdict refuses (veto, stale), from its JSON event."""
    try:
        event = json.loads(event)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("event") != "chunk":
        return None
    if event.get("verdict") not in (VETO, STALE):
        return None
    return parse_request_id(str(event.get("request", "")))


def parse_request_id(frame_id: str) -> int | None:
    if frame_id.startswith(REQUEST_PREFIX):
        try:
            return int(frame_id[len(REQUEST_PREFIX) :])
        except ValueError:
            return None
    return None


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
        unit = self.speed_scaling_unit = params.speed_scaling_unit
        if unit not in UNITS:
            raise ValueError(f"speed_scaling_unit must be one of {sorted(UNITS)}, got {unit!r}")
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
        self.tick_us = Reservoir(20_000)
        self.period_error_ms = Reservoir(20_000)
        self.overruns = 0
        self._last_tick_ns: int | None = None
        self._warn = ThrottledLog(self.get_logger().warning)
        self._warn_scaling = ThrottledLog(self.get_logger().warning)
        self._speed: float | None = None  # latest valid speed fraction (None: none yet)
        self._speed_at: float | None = None  # time.monotonic() of that reading
        self._speed_rejected = 0
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

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.tick_source == "timer":
            self.create_timer(self.config.control_period_s, self.tick)
        else:
            # The tick thread must get the GIL back promptly when its deadline comes.
            sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
            self._thread = threading.Thread(target=self._tick_loop, name="control", daemon=True)
            self._thread.start()
        scaling = (
            f"speed scaling from {self.speed_scaling_topic} ({self.speed_scaling_unit})"
            if self.speed_scaling_topic else "no speed scaling"
        )  # fmt: skip
        self.get_logger().info(
            f"streamer: {self.control_rate_hz:g} Hz ({self.tick_source}), mode {self.config.mode}, "
            f"requests {self.config.request_policy}, joints {self.joint_names}, {scaling}"
        )

    # ------------------------------------------------------------------ control loop

    def _tick_loop(self) -> None:
        sleep_until = _absolute_sleeper()
        period_ns = round(self.config.control_period_s * 1e9)
        deadline = time.monotonic_ns() + period_ns
        while not self._stop.is_set():
            sleep_until(deadline)
            if self._stop.is_set():
                break
            self.tick()
            deadline += period_ns
            late = time.monotonic_ns() - deadline
            if late > 0:  # overran a whole period: skip the missed ticks, never burst
                missed = late // period_ns + 1
                self.overruns += missed
                deadline += missed * period_ns

    def tick(self) -> None:
        """One control step: advance the plan, publish the command and maybe a request."""
        started = time.perf_counter()
        self._record_period()
        now = self._now()
        with self._lock:
            streamer = self.streamer
            if streamer is None:
                return
            setpoint = streamer.tick(now)
            request = streamer.make_request(now) if streamer.want_request(now) else None
        command = JointState()
        command.header.stamp = Time(nanoseconds=round(setpoint.time * 1e9)).to_msg()
        command.name = self.joint_names
        command.position = setpoint.position.tolist()
        command.velocity = setpoint.velocity.tolist()
        self._command_pub.publish(command)
        if request is not None:
            self._request_pub.publish(self._request_message(request))
        self.tick_us.add((time.perf_counter() - started) * 1e6)

    def _record_period(self) -> None:
        """Deviation of each tick's period from the nominal one: wall (monotonic) time, or the
        ROS clock when ticking on a sim-time timer."""
        if self.tick_source == "timer" and self.get_clock().ros_time_is_active:
            now_ns = self.get_clock().now().nanoseconds
        else:
            now_ns = time.monotonic_ns()
        if self._last_tick_ns is not None:
            period_ms = (now_ns - self._last_tick_ns) * 1e-6
            self.period_error_ms.add(abs(period_ms - self.config.control_period_s * 1e3))
        self._last_tick_ns = now_ns

    def _request_message(self, request) -> JointTrajectory:
        return chunk_msg(self.joint_names, request.stamp, request.times_from_start,
                         request.positions, f"{REQUEST_PREFIX}{request.request_id}")  # fmt: skip

    # ------------------------------------------------------------------ inputs

    def _on_speed_scaling(self, msg: Float64) -> None:
        fraction, warning = speed_fraction(msg.data, self.speed_scaling_unit)
        if warning is not None:
            self._warn_scaling(f"{self.speed_scaling_topic}: {warning}")
        if fraction is None:
            self._speed_rejected += 1
            return
        previous = self._speed
        with self._lock:
            self._speed, self._speed_at = fraction, time.monotonic()
            if self.streamer is not None:
                self.streamer.set_speed_scaling(fraction)
        if previous is None:
            self.get_logger().info(f"speed scaling {fraction:.0%}")
        elif (previous == 0.0) != (fraction == 0.0):
            self.get_logger().info(
                "speed scaling 0: plan paused" if fraction == 0.0
                else f"speed scaling {fraction:.0%}: plan resumed"
            )  # fmt: skip

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
        index = {name: i for i, name in enumerate(msg.name)}
        if self.streamer is not None:
            # Commands follow the plan open loop; only a held command is brought to the arm.
            if all(j in index for j in self.arm_joints) and len(msg.position) >= len(msg.name):
                arm = [msg.position[index[j]] for j in self.arm_joints]
                has_velocity = len(msg.velocity) == len(msg.name)
                velocity = [msg.velocity[index[j]] for j in self.arm_joints] if has_velocity else []
                if has_velocity and all(math.isfinite(p) for p in arm + velocity):
                    with self._lock:
                        resynced = self.streamer.resync(arm, velocity, self.resync_tolerance)
                    if resynced:
                        self.get_logger().warning("held command moved to the measured arm")
            return
        if any(j not in index for j in self.arm_joints) or len(msg.position) < len(msg.name):
            self._warn(f"joint state lacks arm joints {self.arm_joints}; not starting yet")
            return
        position = [msg.position[index[j]] for j in self.arm_joints]
        if self.gripper_joint is not None:
            if self.gripper_joint in index:
                position.append(msg.position[index[self.gripper_joint]])
            else:
                position.append(self.gripper_open)
        if not all(math.isfinite(p) for p in position):
            self._warn(f"non-finite joint state {position}; not starting yet")
            return
        if self.speed_scaling_topic and self._speed is None:
            self._warn(
                f"no speed scaling on {self.speed_scaling_topic} yet; not starting (set "
                "speed_scaling_topic:='' to stream without it)"
            )
            return
        with self._lock:
            self.streamer = ActionStreamer(
                self.config, self.limits, np.array(position), arm_dof=len(self.arm_joints)
            )
            if self._speed is not None:
                self.streamer.set_speed_scaling(self._speed)
        self.get_logger().info(f"holding the measured state {np.round(position, 4).tolist()}")

    def _on_chunk(self, msg: JointTrajectory) -> None:
        now = self._now()
        if self.streamer is None:
            self._warn("chunk before the first joint state: ignored")
            return
        if to_seconds(msg.header.stamp) < self._episode_start:
            parsed = "observed before the episode started"
        else:
            parsed = self._parse_chunk(msg)
        if isinstance(parsed, str):
            with self._lock:
                self.streamer.counters.chunks_rejected += 1
                self.streamer.counters.last_rejection = parsed
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

    def _parse_chunk(self, msg: JointTrajectory):
        """(times_from_start, positions in our joint order) or the reason it cannot be used.
        The gripper column is optional: without it the gripper keeps its current command."""
        chunk = chunk_from_msg(msg)
        names = list(chunk.joint_names)
        if len(set(names)) != len(names):
            return f"duplicated joint names {names}"
        missing = [j for j in self.arm_joints if j not in names]
        unknown = [n for n in names if n not in self.joint_names]
        if missing or unknown:
            return f"joint names {names}: missing {missing}, unknown {unknown}"
        columns = [names.index(j) if j in names else None for j in self.joint_names]
        rows = []
        with self._lock:
            held_gripper = float(self.streamer.state.position[-1])
        for k, point in enumerate(chunk.positions):
            if len(point) != len(names):
                return f"point {k}: {len(point)} positions for {len(names)} joints"
            rows.append([point[c] if c is not None else held_gripper for c in columns])
        times = np.array(chunk.times)
        return times, np.array(rows, dtype=float).reshape(len(rows), len(columns))

    # ------------------------------------------------------------------ stats

    def metrics(self) -> dict:
        with self._lock:
            values = {} if self.streamer is None else self.streamer.metrics()
        tick = self.tick_us.summary()
        jitter = self.period_error_ms.summary()
        speed_age = None if self._speed_at is None else time.monotonic() - self._speed_at
        values.update(
            speed_scaling_topic=self.speed_scaling_topic,
            speed_scaling_age_s=speed_age,
            speed_scaling_rejected=self._speed_rejected,
            mode=self.config.mode,
            request_policy=self.config.request_policy,
            control_rate_hz=self.control_rate_hz,
            tick_source=self.tick_source,
            tick_us_p50=tick["p50"],
            tick_us_p99=tick["p99"],
            jitter_ms_p50=jitter["p50"],
            jitter_ms_p99=jitter["p99"],
            jitter_ms_max=jitter["max"],
            overruns=self.overruns,
            started=self.streamer is not None,
            episode=self._episode,
        )
        return values

    def publish_stats(self) -> None:
        values = self.metrics()
        level = DiagnosticStatus.OK
        message = "streaming"
        if not values["started"]:
            waiting = "the first joint state"
            if self.speed_scaling_topic and self._speed is None:
                waiting = f"the first joint state and speed scaling ({self.speed_scaling_topic})"
            level, message = DiagnosticStatus.WARN, f"waiting for {waiting}"
        elif values.get("stale_executed"):
            level, message = DiagnosticStatus.ERROR, "stale actions executed"
        elif values.get("speed_scaling") == 0.0:
            level, message = DiagnosticStatus.WARN, "paused (speed scaling 0)"
        elif values.get("holding"):
            level, message = DiagnosticStatus.WARN, "holding (no plan)"
        status = DiagnosticStatus(
            level=level,
            name="streamer",
            message=message,
            values=[KeyValue(key=k, value=_format(v)) for k, v in values.items()],
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
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.publish_stats()


def _format(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    return run_node(StreamerNode, argv)


if __name__ == "__main__":
    sys.exit(main())
