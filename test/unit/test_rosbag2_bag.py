"""rosbag2 bag directories as Jazzy writes them (metadata version 9, MCAP storage), read back
by the `rosbags` library and by the MCAP reader."""

from __future__ import annotations

import pytest
import yaml
from mcap.reader import make_reader
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosReliability
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from vla_runtime.data.rosbag2_bag import (
    INFINITE_NS,
    BagWriter,
    OfferedQos,
    RecordedTopic,
    message_definition,
    subscription_policies,
)

TYPESTORE = get_typestore(Stores.ROS2_JAZZY)
LATCHED = OfferedQos(reliability="reliable", durability="transient_local")
SENSOR = OfferedQos(reliability="best_effort", durability="volatile", history="keep_last", depth=5)
INSTRUCTION_HASH = "RIHS01_" + "ab" * 32


def cdr(message) -> bytes:
    return bytes(TYPESTORE.serialize_cdr(message, message.__msgtype__))


def write_bag(directory):
    string = TYPESTORE.types["std_msgs/msg/String"]
    writer = BagWriter(directory, ros_distro="jazzy")
    writer.add_topic(RecordedTopic("/vla/instruction", "std_msgs/msg/String", [LATCHED],
                                   INSTRUCTION_HASH))  # fmt: skip
    writer.add_topic(RecordedTopic("/chatter", "std_msgs/msg/String", [SENSOR, LATCHED]))
    writer.add_topic(RecordedTopic("/silent", "std_msgs/msg/String", [SENSOR]))
    writer.write("/vla/instruction", cdr(string(data="touch the red cube")), 1_000)
    for k in range(3):
        writer.write("/chatter", cdr(string(data=f"hello {k}")), 2_000 + k)
    writer.close()
    writer.close()  # a second close does nothing
    return writer


def test_metadata_yaml_is_what_jazzy_writes(tmp_path):
    write_bag(tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["metadata.yaml", "run_0.mcap"]
    info = yaml.safe_load((tmp_path / "run" / "metadata.yaml").read_text())
    info = info["rosbag2_bagfile_information"]
    assert list(info) == [
        "version", "storage_identifier", "duration", "starting_time", "message_count",
        "topics_with_message_count", "compression_format", "compression_mode",
        "relative_file_paths", "files", "custom_data", "ros_distro",
    ]  # fmt: skip
    assert info["version"] == 9 and info["storage_identifier"] == "mcap"
    assert info["starting_time"] == {"nanoseconds_since_epoch": 1_000}
    assert info["duration"] == {"nanoseconds": 1_002}
    assert info["message_count"] == 4 and info["relative_file_paths"] == ["run_0.mcap"]
    assert info["files"] == [{"path": "run_0.mcap", "starting_time": info["starting_time"],
                              "duration": info["duration"], "message_count": 4}]  # fmt: skip
    assert info["compression_format"] == info["compression_mode"] == ""
    assert info["ros_distro"] == "jazzy"
    topics = {t["topic_metadata"]["name"]: t for t in info["topics_with_message_count"]}
    assert {name: t["message_count"] for name, t in topics.items()} == {
        "/vla/instruction": 1, "/chatter": 3, "/silent": 0,
    }  # fmt: skip
    instruction = topics["/vla/instruction"]["topic_metadata"]
    assert instruction["type"] == "std_msgs/msg/String"
    assert instruction["serialization_format"] == "cdr"
    assert instruction["type_description_hash"] == INSTRUCTION_HASH
    infinite = {"sec": 9223372036, "nsec": 854775807}  # RMW_DURATION_INFINITE
    assert instruction["offered_qos_profiles"] == [{
        "history": "unknown", "depth": 0, "reliability": "reliable",
        "durability": "transient_local", "deadline": infinite, "lifespan": infinite,
        "liveliness": "automatic", "liveliness_lease_duration": infinite,
        "avoid_ros_namespace_conventions": False,
    }]  # fmt: skip
    chatter = topics["/chatter"]["topic_metadata"]["offered_qos_profiles"]
    assert [(q["reliability"], q["history"], q["depth"]) for q in chatter] == [
        ("best_effort", "keep_last", 5), ("reliable", "unknown", 0),
    ]  # fmt: skip


def test_rosbags_reads_the_bag_directory(tmp_path):
    write_bag(tmp_path / "run")
    with Reader(tmp_path / "run") as reader:
        assert reader.message_count == 4
        connections = {c.topic: c for c in reader.connections}
        instruction = connections["/vla/instruction"]
        assert instruction.msgcount == 1 and instruction.digest == INSTRUCTION_HASH
        assert instruction.ext.offered_qos_profiles == [
            Qos(QosHistory.UNKNOWN, 0, QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL,
                *instruction.ext.offered_qos_profiles[0][4:]),
        ]  # fmt: skip
        assert instruction.ext.offered_qos_profiles[0].deadline.sec == INFINITE_NS // 10**9
        texts = [(c.topic, TYPESTORE.deserialize_cdr(raw, c.msgtype).data, t)
                 for c, t, raw in reader.messages()]  # fmt: skip
    assert texts[0] == ("/vla/instruction", "touch the red cube", 1_000)
    assert [t for topic, t, _ in texts if topic == "/chatter"] == ["hello 0", "hello 1", "hello 2"]


def test_the_mcap_file_keeps_the_ros2_profile_qos_and_bag_metadata(tmp_path):
    writer = write_bag(tmp_path / "run")
    with (tmp_path / "run" / "run_0.mcap").open("rb") as f:
        reader = make_reader(f)
        assert reader.get_header().profile == "ros2"
        summary = reader.get_summary()
        channels = {c.topic: c for c in summary.channels.values()}
        [schema] = {s.name: s for s in summary.schemas.values()}.values()
        assert schema.name == "std_msgs/msg/String" and schema.encoding == "ros2msg"
        instruction = channels["/vla/instruction"]
        assert instruction.message_encoding == "cdr"
        assert instruction.metadata["topic_type_hash"] == INSTRUCTION_HASH
        offered = yaml.safe_load(instruction.metadata["offered_qos_profiles"])
        assert offered == writer.information()["topics_with_message_count"][0][
            "topic_metadata"]["offered_qos_profiles"]  # fmt: skip
        [record] = list(reader.iter_metadata())
        assert record.name == "rosbag2"
        assert yaml.safe_load(record.metadata["serialized_metadata"])["message_count"] == 4


def test_message_definitions_carry_their_dependencies():
    text = message_definition("sensor_msgs/msg/JointState")
    assert text.splitlines()[0] and "Header header" in text.split("=" * 80)[0]
    assert "\nMSG: std_msgs/Header\n" in text and "\nMSG: builtin_interfaces/Time\n" in text
    assert text.count("MSG: builtin_interfaces/Time") == 1


def test_subscriptions_match_every_publisher_and_keep_latched_messages():
    assert subscription_policies([LATCHED]) == ("reliable", "transient_local")
    assert subscription_policies([LATCHED, LATCHED]) == ("reliable", "transient_local")
    # One best-effort or volatile publisher: a reliable or transient-local request would not
    # match it.
    assert subscription_policies([LATCHED, SENSOR]) == ("best_effort", "volatile")
    assert subscription_policies([OfferedQos()]) == ("reliable", "volatile")


def test_an_existing_bag_is_never_overwritten_and_an_empty_one_is_removed(tmp_path):
    write_bag(tmp_path / "run")
    with pytest.raises(FileExistsError):
        BagWriter(tmp_path / "run")
    empty = BagWriter(tmp_path / "empty")
    empty.add_topic(RecordedTopic("/silent", "std_msgs/msg/String", [SENSOR]))
    empty.discard()
    assert not (tmp_path / "empty").exists()
