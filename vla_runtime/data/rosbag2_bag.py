"""rosbag2 bag directories as ROS 2 Jazzy writes them, with MCAP storage; no rclpy here.

A bag `OUT/` holds `OUT_0.mcap` and `metadata.yaml` (`rosbag2_bagfile_information`, version 9).
The MCAP file has the ros2 profile: schema encoding "ros2msg" holding the full message
definition (dependencies appended after `=====` / `MSG: pkg/Type` separators, from the .msg
files in the ament share directories), message encoding "cdr" (the bytes on the wire), each
channel's `offered_qos_profiles` and `topic_type_hash` metadata, and a "rosbag2" metadata
record with the bag's metadata, as rosbag2's MCAP storage plugin writes them. `ros2 bag
info/play`, the `rosbags` library and Foxglove read the bags.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from mcap.writer import CompressionType, Writer

ROSBAG2_VERSION = 9  # the metadata version Jazzy writes: QoS policies as names, not numbers
STORAGE_IDENTIFIER = "mcap"
METADATA_FILE = "metadata.yaml"
# rmw's RMW_DURATION_INFINITE: what the graph reports for an unset deadline, lifespan, lease.
INFINITE_NS = 2**63 - 1
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


@dataclass(frozen=True)
class OfferedQos:
    """One publisher's QoS as the ROS graph reports it, policies by their rmw names
    (keep_last, reliable, best_effort, transient_local, volatile, automatic, unknown, ...).
    Fast DDS reports a remote publisher's history as unknown and its depth as 0; rosbag2 writes
    them so too, and plays such a topic back with its default history."""

    reliability: str = "reliable"
    durability: str = "volatile"
    history: str = "unknown"
    depth: int = 0
    deadline_ns: int = INFINITE_NS
    lifespan_ns: int = INFINITE_NS
    liveliness: str = "automatic"
    liveliness_lease_duration_ns: int = INFINITE_NS
    avoid_ros_namespace_conventions: bool = False

    def to_yaml_node(self) -> dict:
        """The mapping rosbag2 (metadata version 9) writes for one profile."""
        return {
            "history": self.history,
            "depth": self.depth,
            "reliability": self.reliability,
            "durability": self.durability,
            "deadline": _rmw_time(self.deadline_ns),
            "lifespan": _rmw_time(self.lifespan_ns),
            "liveliness": self.liveliness,
            "liveliness_lease_duration": _rmw_time(self.liveliness_lease_duration_ns),
            "avoid_ros_namespace_conventions": self.avoid_ros_namespace_conventions,
        }


def _rmw_time(ns: int) -> dict:
    return {"sec": ns // 1_000_000_000, "nsec": ns % 1_000_000_000}


def offered_qos_profiles_text(offers: Iterable[OfferedQos]) -> str:
    """The `offered_qos_profiles` value of an MCAP channel: the profiles as a YAML document."""
    return _dump([offer.to_yaml_node() for offer in offers])


def subscription_policies(offers: Iterable[OfferedQos]) -> tuple[str, str]:
    """(reliability, durability) that receives from every publisher, as rosbag2 adapts its
    request to the offers: reliable only when all offer it (a reliable subscription never
    matches a best-effort publisher), transient_local only when all offer it (so that latched
    messages published before the recorder joined are recorded too)."""
    offers = list(offers)
    reliable = bool(offers) and all(o.reliability == "reliable" for o in offers)
    latched = bool(offers) and all(o.durability == "transient_local" for o in offers)
    return ("reliable" if reliable else "best_effort", "transient_local" if latched else "volatile")


@dataclass
class RecordedTopic:
    name: str
    type: str
    offered_qos: list[OfferedQos]
    type_description_hash: str = ""
    message_count: int = 0


@dataclass
class BagSpan:
    """The receive times of a bag's first and last messages (ns since the epoch)."""

    first_ns: int | None = None
    last_ns: int | None = None

    def add(self, stamp_ns: int) -> None:
        self.first_ns = stamp_ns if self.first_ns is None else min(self.first_ns, stamp_ns)
        self.last_ns = stamp_ns if self.last_ns is None else max(self.last_ns, stamp_ns)

    @property
    def starting_time_ns(self) -> int:
        return self.first_ns or 0

    @property
    def duration_ns(self) -> int:
        return 0 if self.first_ns is None else self.last_ns - self.first_ns


def bag_information(
    file_name: str,
    topics: Iterable[RecordedTopic],
    span: BagSpan,
    ros_distro: str = "",
) -> dict:
    """The `rosbag2_bagfile_information` mapping of a one-file bag, keys in Jazzy's order."""
    topics = list(topics)
    message_count = sum(t.message_count for t in topics)
    starting_time = {"nanoseconds_since_epoch": span.starting_time_ns}
    duration = {"nanoseconds": span.duration_ns}
    return {
        "version": ROSBAG2_VERSION,
        "storage_identifier": STORAGE_IDENTIFIER,
        "duration": duration,
        "starting_time": starting_time,
        "message_count": message_count,
        "topics_with_message_count": [
            {
                "topic_metadata": {
                    "name": t.name,
                    "type": t.type,
                    "serialization_format": "cdr",
                    "offered_qos_profiles": [o.to_yaml_node() for o in t.offered_qos],
                    "type_description_hash": t.type_description_hash,
                },
                "message_count": t.message_count,
            }
            for t in topics
        ],
        # Bag-level compression: none (the MCAP chunks are zstd-compressed inside the file,
        # which readers undo transparently).
        "compression_format": "",
        "compression_mode": "",
        "relative_file_paths": [file_name],
        "files": [
            {
                "path": file_name,
                "starting_time": dict(starting_time),
                "duration": dict(duration),
                "message_count": message_count,
            }
        ],
        "custom_data": None,
        "ros_distro": ros_distro or os.environ.get("ROS_DISTRO", "jazzy"),
    }


def metadata_yaml(information: dict) -> str:
    return _dump({"rosbag2_bagfile_information": information})


def _dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def bag_file_name(directory: str | Path) -> str:
    """rosbag2's name for a bag's first storage file: `<directory name>_0.mcap`."""
    return f"{Path(directory).name}_0.mcap"


@dataclass
class BagWriter:
    """A rosbag2 bag directory being written: `add_topic`, then `write(topic, cdr, stamp_ns)`;
    `close()` finishes the MCAP file and writes metadata.yaml."""

    directory: Path
    ros_distro: str = ""
    topics: dict[str, RecordedTopic] = field(default_factory=dict)
    span: BagSpan = field(default_factory=BagSpan)

    def __post_init__(self):
        self.directory = Path(self.directory)
        if self.directory.exists() and any(self.directory.iterdir()):
            raise FileExistsError(f"{self.directory} exists and is not empty")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.file_name = bag_file_name(self.directory)
        self.mcap_path = self.directory / self.file_name
        self.metadata_path = self.directory / METADATA_FILE
        self._file = self.mcap_path.open("wb")
        self._writer = Writer(self._file, compression=CompressionType.ZSTD)
        self._writer.start(profile="ros2", library="vla_runtime")
        self._schemas: dict[str, int] = {}
        self._channels: dict[str, int] = {}
        self._closed = False

    def add_topic(self, topic: RecordedTopic) -> None:
        if topic.type not in self._schemas:
            self._schemas[topic.type] = self._writer.register_schema(
                name=topic.type, encoding="ros2msg", data=message_definition(topic.type).encode()
            )
        self._channels[topic.name] = self._writer.register_channel(
            topic=topic.name,
            message_encoding="cdr",
            schema_id=self._schemas[topic.type],
            metadata={
                "offered_qos_profiles": offered_qos_profiles_text(topic.offered_qos),
                "topic_type_hash": topic.type_description_hash,
            },
        )
        self.topics[topic.name] = topic

    def write(self, topic: str, data: bytes, log_time_ns: int) -> None:
        recorded = self.topics[topic]
        self._writer.add_message(
            channel_id=self._channels[topic],
            log_time=log_time_ns,
            data=bytes(data),
            publish_time=log_time_ns,
            sequence=recorded.message_count,
        )
        recorded.message_count += 1
        self.span.add(log_time_ns)

    @property
    def message_count(self) -> int:
        return sum(t.message_count for t in self.topics.values())

    def information(self) -> dict:
        return bag_information(self.file_name, self.topics.values(), self.span, self.ros_distro)

    def close(self) -> None:
        """Finish the MCAP file (its summary and the rosbag2 metadata record) and write
        metadata.yaml; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        information = self.information()
        self._writer.add_metadata("rosbag2", {"serialized_metadata": _dump(information)})
        self._writer.finish()
        self._file.close()
        # Written whole, then renamed: a reader never sees half a metadata file.
        partial = self.metadata_path.with_name(METADATA_FILE + ".partial")
        partial.write_text(metadata_yaml(information))
        partial.replace(self.metadata_path)

    def discard(self) -> None:
        """Close and remove what this writer created (a bag that recorded nothing)."""
        self.close()
        for path in (self.mcap_path, self.metadata_path):
            path.unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:  # something else was put there meanwhile
            pass
