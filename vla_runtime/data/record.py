"""`vla-runtime record`: capture a live stack's topics into a rosbag2 bag directory (MCAP).

`--stack [NAME]` joins the ROS domain of a stack started with `vla-runtime launch` (found
through its run file, stack/run_files.py, with the same localhost-only discovery); `--domain-id
N` joins any domain; with neither, the environment's ROS_DOMAIN_ID. Messages are taken
serialized (the CDR bytes on the wire) into `OUT/OUT_0.mcap` with `OUT/metadata.yaml`, as
`ros2 bag record` on Jazzy writes them (data/rosbag2_bag.py). Each topic is subscribed with a QoS
that matches all its publishers (transient local where they all latch, so messages published
before the recorder joined are kept too), and their offered QoS is recorded. Recording stops at
`--duration`, Ctrl-C or SIGTERM, and the bag is complete either way; a run that recorded nothing
exits 1 and leaves no bag.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions

from vla_runtime.core import topics
from vla_runtime.core.help_text import CommandParser, help_summary
from vla_runtime.data.rosbag2_bag import (
    BagWriter,
    OfferedQos,
    RecordedTopic,
    subscription_policies,
)
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.stack.run_files import (
    RunningStack,
    StackSelectionError,
    running_stacks,
    select_stack,
)

DEFAULT_TOPICS = [
    topics.CLOCK, topics.JOINT_STATES, topics.INSTRUCTION, topics.EPISODE, topics.ACTION_CHUNK,
    topics.CHECKED_CHUNK, topics.COMMAND, topics.INFERENCE_REQUEST, topics.ENGINE_STATS,
    topics.SAFETY_EVENTS, topics.DRIVER_EVENTS, topics.camera_image("scene"),
    topics.camera_image("wrist"), topics.camera_info("scene"), topics.camera_info("wrist"),
]  # fmt: skip
# Queue of each recording subscription: the publishers' depths are not known (Fast DDS reports
# 0), and a burst of latched messages or frames must not be dropped before they are written.
SUBSCRIPTION_DEPTH = 100
DISCOVERY_PERIOD_S = 0.5
# After a stop, messages already received by DDS are still written.
DRAIN_S = 0.2


@dataclass
class Target:
    """The graph to record: `domain_id` None is the environment's ROS_DOMAIN_ID."""

    domain_id: int | None
    localhost_only: bool = False
    stack: RunningStack | None = None
    topics: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.stack is not None:
            return f"stack {self.stack.describe()}"
        domain = self.domain_id if self.domain_id is not None else os.environ.get("ROS_DOMAIN_ID")
        return f"ROS_DOMAIN_ID={domain or 0}"


def offered_qos(endpoint) -> OfferedQos:
    """A publisher's QoS (rclpy TopicEndpointInfo) in rmw's policy names."""
    q = endpoint.qos_profile
    return OfferedQos(
        reliability=q.reliability.name.lower(),
        durability=q.durability.name.lower(),
        history=q.history.name.lower(),
        depth=int(q.depth),
        deadline_ns=q.deadline.nanoseconds,
        lifespan_ns=q.lifespan.nanoseconds,
        liveliness=q.liveliness.name.lower(),
        liveliness_lease_duration_ns=q.liveliness_lease_duration.nanoseconds,
        avoid_ros_namespace_conventions=bool(q.avoid_ros_namespace_conventions),
    )


def subscription_qos(offers: list[OfferedQos]) -> QoSProfile:
    reliability, durability = subscription_policies(offers)
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=SUBSCRIPTION_DEPTH,
        reliability=ReliabilityPolicy[reliability.upper()],
        durability=DurabilityPolicy[durability.upper()],
    )


def _import_message(type_name: str):
    package, kind, name = type_name.split("/")
    return getattr(importlib.import_module(f"{package}.{kind}"), name)


@dataclass
class TopicRecorder:
    """Subscribes `node` to each wanted topic once it has a publisher, and writes what arrives."""

    node: RuntimeNode
    writer: BagWriter
    wanted: set[str] | None  # None: every topic
    skipped: dict[str, str] = field(default_factory=dict)  # topic -> why not recorded
    announce: bool = True  # a line on stderr per topic as its recording starts

    def discover(self) -> None:
        for topic, types in self.node.get_topic_names_and_types():
            if topic in self.writer.topics or topic in self.skipped:
                continue
            if self.wanted is not None and topic not in self.wanted:
                continue
            publishers = self.node.get_publishers_info_by_topic(topic)
            if not publishers:
                continue
            type_name = types[0]
            try:
                message_type = _import_message(type_name)
                offers = [offered_qos(p) for p in publishers]
                self.writer.add_topic(
                    RecordedTopic(topic, type_name, offers, _type_hash(publishers, type_name))
                )
            except (ImportError, AttributeError, ValueError, OSError) as exc:
                self.skipped[topic] = f"{type_name}: {exc}"
                print(f"record: not recording {topic} ({type_name}): {exc}", file=sys.stderr)
                continue
            qos = subscription_qos(offers)
            self.node.create_subscription(
                message_type, topic,
                lambda data, t=topic: self.writer.write(t, data, time.time_ns()), qos, raw=True,
            )  # fmt: skip
            if self.announce:
                policies = f"{qos.reliability.name.lower()}, {qos.durability.name.lower()}"
                print(f"record: recording {topic} ({type_name}; {policies})", file=sys.stderr,
                      flush=True)  # fmt: skip


def _type_hash(publishers, type_name: str) -> str:
    for p in publishers:
        if p.topic_type == type_name and getattr(p, "topic_type_hash", None) is not None:
            return str(p.topic_type_hash)
    return ""


def record(
    out: str | Path,
    wanted: list[str] | None,
    duration_s: float | None,
    target: Target | None = None,
    stop: threading.Event | None = None,
) -> dict:
    """Record the wanted topics (None: all) of `target` into the bag directory `out` until
    `duration_s`, `stop` or Ctrl-C; returns the summary. A bag that recorded no message is
    removed again."""
    target = target or Target(domain_id=None)
    stop = stop or threading.Event()
    writer = BagWriter(Path(out))  # refuses an existing bag before joining the graph
    if target.localhost_only:
        # rmw reads the discovery range when the context starts, as the stack's nodes did.
        os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    context = Context()
    try:
        rclpy.init(args=[], context=context, domain_id=target.domain_id,
                   signal_handler_options=SignalHandlerOptions.NO)  # fmt: skip
    except Exception:
        writer.discard()
        raise
    node = RuntimeNode("vla_recorder", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    recorder = TopicRecorder(node, writer, None if wanted is None else set(wanted))
    started = time.monotonic()
    stopped_by = "duration"
    try:
        last_discovery = float("-inf")
        while duration_s is None or time.monotonic() - started < duration_s:
            if stop.is_set():
                stopped_by = "signal"
                break
            if time.monotonic() - last_discovery >= DISCOVERY_PERIOD_S:
                recorder.discover()
                last_discovery = time.monotonic()
            executor.spin_once(timeout_sec=0.05)
        drain_until = time.monotonic() + DRAIN_S
        while time.monotonic() < drain_until:
            executor.spin_once(timeout_sec=0.02)
    except KeyboardInterrupt:
        stopped_by = "signal"
    finally:
        seconds = time.monotonic() - started
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
        writer.close()
    messages = {name: t.message_count for name, t in writer.topics.items()}
    summary = {
        "out": str(out),
        "source": target.describe(),
        "topics": {name: t.type for name, t in writer.topics.items()},
        "messages": messages,
        "message_count": sum(messages.values()),
        "seconds": round(seconds, 2),
        "stopped_by": stopped_by,
        "not_recorded": recorder.skipped,
    }
    if summary["message_count"] == 0:
        writer.discard()
        summary["out"] = None
        summary["error"] = nothing_recorded_reason(summary, target)
    return summary


def nothing_recorded_reason(summary: dict, target: Target) -> str:
    where, seconds = target.describe(), summary["seconds"]
    if summary["topics"]:
        return (f"{len(summary['topics'])} topics subscribed on {where} but no message arrived "
                f"in {seconds:.1f} s")  # fmt: skip
    reason = f"no publisher of the wanted topics appeared on {where} in {seconds:.1f} s"
    if target.stack is None and target.domain_id is None:
        reason += " (a `vla-runtime launch` stack runs on a domain of its own: add --stack)"
    return reason


def summary_line(summary: dict) -> str:
    return (f"record: {len(summary['topics'])} topics, {summary['message_count']} messages in "
            f"{summary['seconds']:.1f} s from {summary['source']} -> {summary['out']}/ "
            f"(stopped by {summary['stopped_by']})")  # fmt: skip


def choose_target(args: argparse.Namespace) -> Target:
    """Where to record, from --stack / --domain-id (StackSelectionError: no such stack)."""
    if args.stack is not None:
        stack = select_stack(running_stacks(), args.stack or None)
        return Target(stack.domain_id, stack.localhost_only, stack, stack.topics)
    return Target(args.domain_id)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="vla-runtime record", description=help_summary(__doc__))
    parser.add_argument("out", nargs="?", metavar="OUT",
                        help="bag directory to create (rosbag2 layout)")  # fmt: skip
    parser.add_argument("--out", dest="out_option", metavar="OUT", help="same as OUT")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--stack", nargs="?", const="", metavar="NAME",
                       help="join a stack started with `vla-runtime launch` (NAME or NAME-PID, "
                            "needed only when several stacks run)")  # fmt: skip
    where.add_argument("--domain-id", type=int, help="join this ROS_DOMAIN_ID")
    parser.add_argument("--topics", nargs="*", help=f"topics (default: {' '.join(DEFAULT_TOPICS)}"
                        " and, with --stack, the stack's reported topics)")  # fmt: skip
    parser.add_argument("--all", action="store_true", help="every topic that appears")
    parser.add_argument(
        "--duration", type=float, help="stop after S seconds (default: Ctrl-C or SIGTERM)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    return parser


def input_problem(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot be recorded with, or None."""
    if args.out and args.out_option:
        return "give the bag directory once (OUT or --out)"
    out = args.out or args.out_option
    if not out:
        if args.topics:
            return ("the bag directory OUT is required (give it before --topics, which takes "
                    "every word after it)")  # fmt: skip
        return "the bag directory OUT is required"
    if Path(out).suffix == ".mcap":
        return (f"{out}: OUT is a bag directory (it will hold OUT_0.mcap and metadata.yaml); "
                "give it without .mcap")  # fmt: skip
    if Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        return f"{out} exists and is not an empty directory"
    if args.duration is not None and not args.duration > 0:
        return f"--duration must be > 0, got {args.duration}"
    if args.domain_id is not None and not 0 <= args.domain_id <= 232:
        return f"--domain-id must be in 0..232, got {args.domain_id}"
    return None


def record_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.stack and not (args.out or args.out_option):
        # `--stack OUT`: OUT is required and NAME is not, so a word that names no running
        # stack is OUT.
        if not any(args.stack in (s.stack, s.label) for s in running_stacks()):
            args.out, args.stack = args.stack, ""
    problem = input_problem(args)
    if problem is None:
        try:
            target = choose_target(args)
        except StackSelectionError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"vla-runtime record: error: {problem}", file=sys.stderr)
        return 2
    out = args.out or args.out_option
    if args.all:
        wanted = None
    else:
        wanted = list(dict.fromkeys(args.topics or [*DEFAULT_TOPICS, *target.topics]))

    stop = threading.Event()

    def on_signal(_signum, _frame):
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = record(out, wanted, args.duration, target, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.json:
        print(json.dumps(summary), flush=True)
    if summary.get("error"):
        print(f"vla-runtime record: nothing recorded: {summary['error']}", file=sys.stderr)
        return 1
    if not args.json:
        print(summary_line(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(record_main())
