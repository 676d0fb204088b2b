"""RunMonitor: per-topic counts and rates, and camera latency (stamp -> receipt), for run reports.

Not a process of its own: the launcher creates it in-process (own context, sim time on or off)
and spins it next to its other work. Callbacks take raw (serialized) messages and do
constant work, so a 250 Hz topic plus camera streams cost little; for images only the header
stamp is read out of the CDR bytes, the pixels are never deserialized.

Rates are measured twice: `rate_hz` in ROS time (sim time with use_sim_time, which is what the
stack's contracts are written in) and `wall_rate_hz` on the monotonic clock. For a message with
a header `rate_hz` runs on its stamps: receipt times in sim time bunch up whenever /clock or the
topic is delivered late, and would read more than the publisher's rate.
"""

from __future__ import annotations

import importlib
import json
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from rclpy.clock import Clock, ClockType
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message

from vla_runtime.core import topics
from vla_runtime.core.stats import RateMeter, Reservoir
from vla_runtime.ros.node import RuntimeNode

IMAGE_TYPE = "sensor_msgs/msg/Image"
# JSON event topics: counted by kind (chunk verdicts by verdict).
EVENT_TOPICS = (topics.SAFETY_EVENTS, topics.DRIVER_EVENTS)
# Stats topics (engine, streamer): the newest status values go into the report as well.
DIAGNOSTICS_TYPE = "diagnostic_msgs/msg/DiagnosticArray"
_CAMERA_PREFIX, _CAMERA_SUFFIX = topics.camera_image("\0").split("\0")


def camera_name_of(topic: str) -> str | None:
    """'wrist' for '/vla/cameras/wrist/image_raw'; None for any other topic."""
    if topic.startswith(_CAMERA_PREFIX) and topic.endswith(_CAMERA_SUFFIX):
        name = topic[len(_CAMERA_PREFIX) : len(topic) - len(_CAMERA_SUFFIX)]
        return name if name and "/" not in name else None
    return None


def message_class(type_name: str):
    """Resolve 'pkg/msg/Type' (or 'pkg/Type') to its Python class."""
    try:
        from rosidl_runtime_py.utilities import get_message
    except ImportError:
        parts = type_name.split("/")
        if len(parts) == 2:
            parts = [parts[0], "msg", parts[1]]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"not a message type name: '{type_name}'") from None
        package, kind, name = parts
        return getattr(importlib.import_module(f"{package}.{kind}"), name)
    return get_message(type_name)


def header_stamp_ns(serialized: bytes) -> int | None:
    """The header stamp of a serialized message whose first field is std_msgs/Header
    (sensor_msgs/Image among them): 4 bytes of encapsulation, then int32 sec, uint32 nanosec."""
    if len(serialized) < 12:
        return None
    byte_order = "<" if serialized[1] & 1 else ">"  # odd encapsulation id = little endian
    sec, nanosec = struct.unpack_from(byte_order + "iI", serialized, 4)
    return sec * 1_000_000_000 + nanosec


def has_header(msg_type) -> bool:
    """Whether the message's first field is a std_msgs/Header (what header_stamp_ns reads)."""
    fields = iter(msg_type.get_fields_and_field_types().items())
    return next(fields, None) == ("header", "std_msgs/Header")


@dataclass
class TopicStats:
    type_name: str | None = None
    count: int = 0
    ros_rate: RateMeter = field(default_factory=RateMeter)
    wall_rate: RateMeter = field(default_factory=RateMeter)
    latency_ms: Reservoir | None = None
    last_status: dict[str, dict[str, str]] | None = None  # DiagnosticArray: name -> key -> value
    event_counts: Counter | None = None  # JSON event topics: "chunk:veto", "command_timeout", …


class RunMonitor(RuntimeNode):
    """Watches `topic_names` (None: every topic it discovers, minus `exclude`)."""

    def __init__(
        self,
        topic_names: Iterable[str] | None = None,
        *,
        context=None,
        use_sim_time: bool = False,
        node_name: str = "run_monitor",
        exclude: Iterable[str] = (),
        discovery_period_s: float = 0.5,
        latency_capacity: int = 10_000,
    ) -> None:
        super().__init__(
            node_name,
            context=context,
            parameter_overrides=[Parameter("use_sim_time", Parameter.Type.BOOL, use_sim_time)],
        )
        self._watch_all = topic_names is None
        self._exclude = set(exclude)
        self._latency_capacity = latency_capacity
        self._lock = threading.Lock()
        self._stats: dict[str, TopicStats] = {}
        self._unresolvable: set[str] = set()
        for name in topic_names or ():
            self._stats[name] = TopicStats()
        # Discovery runs on the steady clock: under sim time a timer would wait for /clock.
        self.create_timer(
            discovery_period_s, self.discover, clock=Clock(clock_type=ClockType.STEADY_TIME)
        )
        self.discover()

    def discover(self) -> None:
        """Subscribe to watched topics that have appeared in the graph since the last call."""
        for name, type_names in self.get_topic_names_and_types():
            if name in self._exclude or not type_names:
                continue
            with self._lock:
                stats = self._stats.get(name)
                if stats is None and not self._watch_all:
                    continue
                if stats is not None and stats.type_name is not None:
                    continue
            self._subscribe(name, type_names[0])

    def _subscribe(self, name: str, type_name: str) -> None:
        try:
            msg_type = message_class(type_name)
        except (ImportError, AttributeError, ValueError) as exc:
            if name not in self._unresolvable:
                self._unresolvable.add(name)
                self.get_logger().warning(f"not monitoring {name}: type {type_name}: {exc}")
            return
        is_image = type_name == IMAGE_TYPE
        # Best effort + volatile matches every publisher (reliable or not); latched samples
        # published before we joined are missed, which a rate measurement does not need.
        qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST,
            depth=10 if is_image else 100,
            reliability=ReliabilityPolicy.BEST_EFFORT,
            durability=DurabilityPolicy.VOLATILE,
        )
        with self._lock:
            stats = self._stats.setdefault(name, TopicStats())
            stats.type_name = type_name
            if is_image:
                stats.latency_ms = Reservoir(self._latency_capacity)
        if is_image:
            callback = self._image_callback(stats)
        elif type_name == DIAGNOSTICS_TYPE:
            callback = self._diagnostics_callback(stats, msg_type)
        elif name in EVENT_TOPICS:
            callback = self._events_callback(stats, msg_type)
        else:
            callback = self._counting_callback(stats, has_header(msg_type))
        self.create_subscription(msg_type, name, callback, qos, raw=True)

    def _count(self, stats: TopicStats, stamp_ns: int | None = None) -> int:
        """Record one receipt, in ROS time at `stamp_ns` when the message carries a stamp;
        returns the receipt time in the node's clock (ns, 0 = unset)."""
        now_ns = self.get_clock().now().nanoseconds
        wall = time.monotonic()
        ros_ns = stamp_ns or now_ns  # under sim time the clock reads 0 until the first /clock
        with self._lock:
            stats.count += 1
            stats.wall_rate.add(wall)
            if ros_ns > 0:
                stats.ros_rate.add(ros_ns * 1e-9)
        return now_ns

    def _counting_callback(self, stats: TopicStats, stamped: bool):
        def on_message(serialized: bytes) -> None:
            self._count(stats, header_stamp_ns(serialized) if stamped else None)

        return on_message

    def _image_callback(self, stats: TopicStats):
        def on_image(serialized: bytes) -> None:
            stamp_ns = header_stamp_ns(serialized)
            now_ns = self._count(stats, stamp_ns)
            if now_ns > 0 and stamp_ns:
                with self._lock:
                    stats.latency_ms.add((now_ns - stamp_ns) * 1e-6)

        return on_image

    def _events_callback(self, stats: TopicStats, msg_type):
        """Safety/driver events (std_msgs/String, one JSON object each): counted by kind, chunk
        verdicts by verdict, so the report shows what happened to every chunk."""

        def on_event(serialized: bytes) -> None:
            self._count(stats)
            try:
                event = json.loads(deserialize_message(serialized, msg_type).data)
                kind = str(event.get("event", "?"))
                if "verdict" in event:
                    kind = f"{kind}:{event['verdict']}"
            except (ValueError, AttributeError):
                kind = "unparsable"
            with self._lock:
                stats.event_counts = stats.event_counts or Counter()
                stats.event_counts[kind] += 1

        return on_event

    def _diagnostics_callback(self, stats: TopicStats, msg_type):
        def on_diagnostics(serialized: bytes) -> None:
            self._count(stats)
            msg = deserialize_message(serialized, msg_type)  # a few Hz: decoding is cheap
            status = {st.name: {kv.key: kv.value for kv in st.values} for st in msg.status}
            with self._lock:
                stats.last_status = {**(stats.last_status or {}), **status}

        return on_diagnostics

    def report(self) -> dict:
        """{"topics": {name: {"type", "count", "rate_hz", "wall_rate_hz"}},
        "cameras": {name: {"latency_ms": {"p50", "p99", "max", "mean", "n"}, "rate_hz"}},
        "diagnostics": {topic: {status name: {key: value}}} (newest values of stats topics),
        "events": {topic: {kind: count}} (safety and driver event topics)}"""
        topics_report, cameras, diagnostics, events = {}, {}, {}, {}
        with self._lock:
            for name, stats in sorted(self._stats.items()):
                topics_report[name] = {
                    "type": stats.type_name,
                    "count": stats.count,
                    "rate_hz": stats.ros_rate.rate_hz,
                    "wall_rate_hz": stats.wall_rate.rate_hz,
                }
                if stats.last_status:
                    diagnostics[name] = stats.last_status
                if stats.event_counts:
                    events[name] = dict(sorted(stats.event_counts.items()))
                camera = camera_name_of(name)
                if camera is None:
                    continue
                summary = stats.latency_ms.summary() if stats.latency_ms else {"n": 0}
                cameras[camera] = {
                    "latency_ms": {
                        key: summary.get(key) for key in ("p50", "p99", "max", "mean", "n")
                    },
                    "rate_hz": stats.ros_rate.rate_hz,
                }
        return {
            "topics": topics_report,
            "cameras": cameras,
            "diagnostics": diagnostics,
            "events": events,
        }
