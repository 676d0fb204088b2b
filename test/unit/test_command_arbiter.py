"""The driver's command arbiter against a scripted ROS graph: a message that arrives before
discovery names its publisher waits to be attributed, and is refused unless the source alone
accounts for every publisher matched when it arrived."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from vla_runtime.drivers import command_topics
from vla_runtime.drivers.command_topics import CommandArbiter

JTC = "/fr3_arm_controller/joint_trajectory"
UNKNOWN = ("/_NODE_NAMESPACE_UNKNOWN_", "_NODE_NAME_UNKNOWN_")


@dataclass
class Info:
    node_namespace: str
    node_name: str
    endpoint_gid: bytes


class Subscription:
    def __init__(self, graph):
        self.graph = graph

    def get_publisher_count(self) -> int:
        return len(self.graph.publishers)


class Graph:
    """The slice of an rclpy node the arbiter uses; `publishers` is what the graph shows on
    the trajectory topic (matched to the subscription whether named or not)."""

    def __init__(self):
        self.publishers: list[Info] = []
        self.callbacks = {}
        self.logged: list[str] = []

    def resolve_topic_name(self, topic: str) -> str:
        return topic

    def get_namespace(self) -> str:
        return "/"

    def create_timer(self, period, callback):
        return None

    def create_subscription(self, msg_type, topic, callback, depth):
        self.callbacks[topic] = callback
        return Subscription(self)

    def get_publishers_info_by_topic(self, topic: str) -> list[Info]:
        return list(self.publishers) if topic == JTC else []

    def get_logger(self):
        return self

    def error(self, text: str) -> None:
        self.logged.append(text)

    warning = error


@pytest.fixture
def arbiter():
    graph = Graph()
    events, received = [], []
    arbiter = CommandArbiter(graph, {"trajectory": JTC}, "trajectory", "/safety",
                             events.append, lambda: None)  # fmt: skip
    arbiter.subscribe("trajectory", object, received.append)
    return graph, arbiter, events, received


def test_the_sources_first_command_waits_for_discovery_to_name_it(arbiter):
    graph, arbiter, events, received = arbiter
    graph.publishers = [Info(*UNKNOWN, b"\x01")]
    graph.callbacks[JTC]("first")
    assert received == [] and events == []  # waiting, not refused
    graph.publishers = [Info("/", "safety", b"\x01")]
    arbiter.check()
    assert received == ["first"] and events == []
    graph.callbacks[JTC]("second")  # named now: passed on at once
    assert received == ["first", "second"]


def test_a_newer_command_supersedes_a_waiting_one(arbiter):
    graph, arbiter, events, received = arbiter
    graph.publishers = [Info(*UNKNOWN, b"\x01")]
    graph.callbacks[JTC]("old")
    graph.callbacks[JTC]("new")
    graph.publishers = [Info("/", "safety", b"\x01")]
    arbiter.check()
    assert received == ["new"]


def test_a_command_sent_while_an_unnamed_publisher_was_matched_is_refused_after_it_left(arbiter):
    graph, arbiter, events, received = arbiter
    graph.publishers = [Info("/", "safety", b"\x01"), Info(*UNKNOWN, b"\x02")]
    arbiter.check()
    graph.callbacks[JTC]("maybe the stranger's")
    assert received == [] and events == []
    graph.publishers = [Info("/", "safety", b"\x01")]  # it left before being named
    arbiter.check()
    assert received == []
    assert [e["event"] for e in events] == ["ignored"]


def test_a_publisher_named_as_another_node_latches_the_fault_and_the_command_is_refused(arbiter):
    graph, arbiter, events, received = arbiter
    graph.publishers = [Info(*UNKNOWN, b"\x02")]
    graph.callbacks[JTC]("rogue's")
    graph.publishers = [Info("/", "teleop", b"\x02")]
    arbiter.check()
    assert arbiter.fault["node"] == "/teleop" and received == []
    assert [e["event"] for e in events] == ["reflex", "ignored"]
    assert "latched" in events[1]["reason"] and "/teleop publishes" in graph.logged[0]


def test_a_command_never_attributed_is_refused_after_the_grace(arbiter, monkeypatch):
    graph, arbiter, events, received = arbiter
    now = [100.0]
    monkeypatch.setattr(command_topics.time, "monotonic", lambda: now[0])
    graph.publishers = [Info(*UNKNOWN, b"\x01")]
    graph.callbacks[JTC]("unattributed")
    now[0] += command_topics.DISCOVERY_GRACE_S / 2
    arbiter.check()
    assert received == [] and events == []
    now[0] += command_topics.DISCOVERY_GRACE_S
    arbiter.check()
    assert received == []
    assert events[0]["event"] == "ignored" and "not yet named" in events[0]["reason"]
