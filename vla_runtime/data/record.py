"""`vla-runtime record`: capture raw topics of a live stack to MCAP, as rosbag2 stores them.

Messages are taken serialized (CDR, exactly the bytes on the wire) and written with the ros2
profile: schema encoding "ros2msg" holding the full message definition (dependencies appended
after `=====` / `MSG: pkg/Type` separators, from the .msg files in the ament share
directories), message encoding "cdr", and each channel's `offered_qos_profiles` metadata, so
`ros2 bag info/play` and Foxglove read the files. The pure part (definitions, writer) has no
rclpy dependency; `record_main` runs the subscribing node.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time
from pathlib import Path

import rclpy
from mcap.writer import CompressionType, Writer
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions

from vla_runtime.core import topics
from vla_runtime.core.help_text import help_summary
from vla_runtime.ros.node import RuntimeNode

DEFAULT_TOPICS = [
    topics.CLOCK, topics.JOINT_STATES, topics.INSTRUCTION, topics.ACTION_CHUNK,
    topics.CHECKED_CHUNK, topics.COMMAND, topics.INFERENCE_REQUEST, topics.ENGINE_STATS,
    topics.SAFETY_EVENTS, topics.DRIVER_EVENTS, topics.camera_image("scene"),
    topics.camera_image("wrist"), topics.camera_info("scene"), topics.camera_info("wrist"),
]  # fmt: skip
SEPARATOR = "=" * 80
PRIMITIVES = {
    "bool", "byte", "char", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
    "uint32", "int64", "uint64", "string", "wstring",
}  # fmt: skip


def share_dirs() -> list[Path]:
    dirs = [
        Path(p) / "share" for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p
    ]
    dirs.append(Path(sys.prefix) / "share")
    return [d for d in dirs if d.is_dir()]


def _msg_file(package: str, name: str) -> Path:
    for share in share_dirs():
        path = share / package / "msg" / f"{name}.msg"
        if path.is_file():
            return path
    raise FileNotFoundError(f"no definition for {package}/msg/{name} in {share_dirs()}")


def message_definition(type_name: str) -> str:
    """rosbag2's ros2msg text for e.g. "sensor_msgs/msg/Image": the message then every nested
    type once, each after a separator line and `MSG: pkg/Type`."""
    package, _, name = type_name.split("/")
    main = _msg_file(package, name).read_text()
    seen: list[str] = []
    pending = [(package, main)]
    parts = [main.rstrip("\n")]
    while pending:
        owner, text = pending.pop(0)
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line or "=" in line.split()[0]:
                continue
            field_type = re.sub(r"\[.*\]|<=\d+", "", line.split()[0])
            if field_type in PRIMITIVES:
                continue
            if "/" in field_type:
                dep_package, dep_name = field_type.split("/")[0], field_type.split("/")[-1]
            elif field_type == "Header":
                dep_package, dep_name = "std_msgs", "Header"
            else:
                dep_package, dep_name = owner, field_type
            key = f"{dep_package}/{dep_name}"
            if key in seen:
                continue
            seen.append(key)
            dep = _msg_file(dep_package, dep_name).read_text()
            parts.append(f"{SEPARATOR}\nMSG: {key}\n{dep.rstrip(chr(10))}")
            pending.append((dep_package, dep))
    return "\n".join(parts) + "\n"


def qos_metadata(reliability: str, durability: str, depth: int = 10) -> str:
    """rosbag2's offered_qos_profiles YAML for one publisher."""
    return (
        f"- history: 1\n  depth: {depth}\n  reliability: {reliability}\n"
        f"  durability: {durability}\n  deadline:\n    sec: 2147483647\n    nsec: 4294967295\n"
        f"  lifespan:\n    sec: 2147483647\n    nsec: 4294967295\n  liveliness: 1\n"
        f"  liveliness_lease_duration:\n    sec: 2147483647\n    nsec: 4294967295\n"
        f"  avoid_ros_namespace_conventions: false\n"
    )


class McapRosWriter:
    """MCAP file with the ros2 profile; `write(topic, type, cdr_bytes, stamp_ns)`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("wb")
        self._writer = Writer(self._file, compression=CompressionType.ZSTD)
        self._writer.start(profile="ros2", library="vla_runtime")
        self._schemas: dict[str, int] = {}
        self._channels: dict[str, int] = {}
        self._sequence: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def add_topic(self, topic: str, type_name: str, qos: str = "") -> None:
        if type_name not in self._schemas:
            self._schemas[type_name] = self._writer.register_schema(
                name=type_name, encoding="ros2msg", data=message_definition(type_name).encode()
            )
        self._channels[topic] = self._writer.register_channel(
            topic=topic,
            message_encoding="cdr",
            schema_id=self._schemas[type_name],
            metadata={"offered_qos_profiles": qos or qos_metadata(1, 2)},
        )
        self._sequence[topic] = 0
        self.counts[topic] = 0

    def write(self, topic: str, data: bytes, log_time_ns: int) -> None:
        self._writer.add_message(
            channel_id=self._channels[topic],
            log_time=log_time_ns,
            data=bytes(data),
            publish_time=log_time_ns,
            sequence=self._sequence[topic],
        )
        self._sequence[topic] += 1
        self.counts[topic] += 1

    def close(self) -> None:
        self._writer.finish()
        self._file.close()


def _import_message(type_name: str):
    package, kind, name = type_name.split("/")
    return getattr(importlib.import_module(f"{package}.{kind}"), name)


def record(out: str | Path, wanted: list[str] | None, duration_s: float | None,
           discover_s: float = 3.0, progress: bool = True) -> dict:  # fmt: skip
    """Subscribe (serialized) to the wanted topics that exist, write until duration or Ctrl-C."""

    rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
    node = RuntimeNode("vla_recorder")
    writer = McapRosWriter(out)
    subscribed: dict[str, str] = {}

    def subscribe_new() -> None:
        for topic, types in node.get_topic_names_and_types():
            if topic in subscribed or (wanted is not None and topic not in wanted):
                continue
            publishers = node.get_publishers_info_by_topic(topic)
            if not publishers:
                continue
            latched = any(
                p.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for p in publishers
            )
            best_effort = any(
                p.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT for p in publishers
            )
            reliability = (
                ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE
            )
            durability = DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE
            qos = QoSProfile(depth=100, reliability=reliability, durability=durability)
            type_name = types[0]
            writer.add_topic(topic, type_name, qos_metadata(2 if best_effort else 1,
                                                            1 if latched else 2))  # fmt: skip
            node.create_subscription(
                _import_message(type_name), topic,
                lambda data, t=topic: writer.write(t, data, time.time_ns()), qos, raw=True,
            )  # fmt: skip
            subscribed[topic] = type_name

    started = time.monotonic()
    interrupted = False
    last_discovery = -1.0
    try:
        while duration_s is None or time.monotonic() - started < duration_s:
            now = time.monotonic()
            if now - last_discovery >= discover_s:
                subscribe_new()
                last_discovery = now
            rclpy.spin_once(node, timeout_sec=0.05)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        writer.close()
        node.destroy_node()
        rclpy.try_shutdown()
    return {
        "out": str(out),
        "topics": subscribed,
        "messages": writer.counts,
        "seconds": round(time.monotonic() - started, 2),
        "interrupted": interrupted,
    }


def record_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vla-runtime record", description=help_summary(__doc__))
    parser.add_argument("--out", required=True, help="output .mcap file")
    parser.add_argument("--topics", nargs="*", help=f"topics (default: {' '.join(DEFAULT_TOPICS)})")
    parser.add_argument("--all", action="store_true", help="every topic that appears")
    parser.add_argument("--duration", type=float, help="stop after S seconds (default: Ctrl-C)")
    args = parser.parse_args(argv)
    wanted = None if args.all else (args.topics or DEFAULT_TOPICS)
    summary = record(args.out, wanted, args.duration)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(record_main())
