"""Which commands an arm driver obeys, as pure logic: one source (the safety gate) on one
interface, no automatic recovery from a latched fault, and a re-arm from the measured state.

- `CommandSource`: judges the publishers seen on the driver's command topics (node name and
  GID, from the ROS graph). Any publisher other than the source latches the fault
  "rogue_publisher"; the source publishing on an interface the driver does not obey is reported
  once (the arm gets nothing from it and holds). rclpy (jazzy) gives a message no publisher
  GID, so a message is attributed by count: it is obeyed only while every publisher matched to
  the subscription is a known publisher of the source.
- `Rearm`: after an operator recovery the next command must agree with the measured position;
  one far from it is refused, never jumped to.
- `StopLatch`: a UR protective or emergency stop, held after it clears until the operator
  recovers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from vla_runtime.core.ur_servo import StopMonitor

ROGUE_PUBLISHER = "rogue_publisher"
COMMAND_INTERFACES = ("forward_position", "trajectory")
REARM_TOLERANCE = 0.05  # rad: the safety gate's start tolerance


def qualified_name(namespace: str, name: str) -> str:
    """The fully qualified node name ("/ns/name", "/name") of `name` in `namespace`."""
    return f"{namespace.rstrip('/')}/{name}"


def resolve_source(source: str, namespace: str) -> str:
    """The fully qualified name of the source node: absolute as given, relative to `namespace`
    otherwise. Raises ValueError for an empty or malformed name."""
    text = source.strip()
    if not text or text.endswith("/") or "//" in text:
        raise ValueError(f"command_source must be a node name such as /safety, got {source!r}")
    return text if text.startswith("/") else qualified_name(namespace, text)


def interface_roles(interface: str) -> tuple[str, str]:
    """The command-topic roles ("forward", "trajectory") of the obeyed and the ignored arm
    interface of `command_interface`."""
    roles = {"forward_position": "forward", "trajectory": "trajectory"}
    if interface not in roles:
        raise ValueError(
            f"command_interface must be one of {COMMAND_INTERFACES}, got {interface!r}"
        )
    used = roles[interface]
    return used, "trajectory" if used == "forward" else "forward"


def interface_delay_s(interface: str, trajectory_lookahead: float, gate_period_s: float) -> float:
    """How long after the safety gate sends a command the arm's controller setpoint is there: a
    one-point trajectory is reached `trajectory_lookahead` gate periods later (the way MoveIt
    Servo streams to a trajectory controller); a forward position command is the setpoint at
    once. A streamer that does not lead its commands by it runs the arm that much behind every
    plan, and each chunk, planned from where the arm is, starts that much short."""
    interface_roles(interface)
    if not (math.isfinite(trajectory_lookahead) and trajectory_lookahead >= 0):
        raise ValueError(f"trajectory_lookahead must be >= 0 periods, got {trajectory_lookahead}")
    if not (math.isfinite(gate_period_s) and gate_period_s > 0):
        raise ValueError(f"the gate period must be > 0 s, got {gate_period_s}")
    return trajectory_lookahead * gate_period_s if interface == "trajectory" else 0.0


# What the ROS graph names a publisher whose node it has not learnt yet (rmw's placeholders).
UNKNOWN_NODE_MARKERS = ("_NODE_NAME_UNKNOWN_", "_NODE_NAMESPACE_UNKNOWN_")


@dataclass(frozen=True)
class Publisher:
    node: str  # fully qualified node name
    gid: str  # the endpoint GID, hex

    @property
    def identified(self) -> bool:
        return not any(marker in self.node for marker in UNKNOWN_NODE_MARKERS)


@dataclass
class CommandSource:
    """The publishers on a driver's command topics, judged against the one allowed `source`.

    `obeyed` are the roles whose messages the driver follows; `ignored` the arm interface it
    does not subscribe (watched so that commands sent there are not silently lost)."""

    source: str
    topics: dict[str, str]  # role -> resolved topic name
    obeyed: tuple[str, ...]
    ignored: tuple[str, ...] = ()
    fault: dict | None = None  # the latched rogue_publisher event fields, until cleared
    _source_gids: dict[str, set[str]] = field(default_factory=dict)
    _identified: dict[str, int] = field(default_factory=dict)  # role -> publishers named
    _rogues: dict[str, set[Publisher]] = field(default_factory=dict)
    _reported: set[tuple[str, Publisher]] = field(default_factory=set)

    def observe(self, role: str, publishers: Iterable[Publisher]) -> list[dict]:
        """Record the (identified) publishers on `role`'s topic now; the events to report
        (each once per publisher): "reflex"/"rogue_publisher" for a publisher other than the
        source (the first latches the fault), "unused_interface" for the source on an ignored
        interface."""
        topic = self.topics[role]
        # Not judged until the graph names its node; meanwhile its matched endpoint keeps
        # `admits` refusing the topic's messages.
        publishers = {p for p in publishers if p.identified}
        self._identified[role] = len(publishers)
        self._source_gids[role] = {p.gid for p in publishers if p.node == self.source}
        rogues = {p for p in publishers if p.node != self.source}
        self._rogues[role] = rogues
        events = []
        for publisher in sorted(publishers, key=lambda p: (p.node, p.gid)):
            key = (role, publisher)
            if key in self._reported:
                continue
            if publisher in rogues:
                event = {
                    "event": "reflex", "fault": ROGUE_PUBLISHER, "topic": topic,
                    "node": publisher.node, "gid": publisher.gid, "source": self.source,
                }  # fmt: skip
                if self.fault is None:
                    self.fault = event
            elif role in self.ignored:
                event = {
                    "event": "unused_interface", "topic": topic, "node": publisher.node,
                    "reason": "the driver obeys the other arm command interface",
                }  # fmt: skip
            else:
                continue
            self._reported.add(key)
            events.append(event)
        # A publisher that left and comes back is reported again.
        self._reported = {(r, p) for r, p in self._reported if r != role or p in publishers}
        return events

    def admits(self, role: str, matched: int) -> bool:
        """Whether a message on `role`'s topic, received while `matched` publishers are matched
        to the subscription, is the source's: nothing latched, and no more publishers matched
        than the graph shows of the source (one not yet identified may be a rogue)."""
        if self.fault is not None or role not in self.obeyed:
            return False
        return 0 < matched <= len(self._source_gids.get(role, ()))

    def identifying(self, role: str, matched: int) -> bool:
        """Whether a message `admits` refuses on `role`'s topic is refused only because the
        graph has not yet named some of the `matched` publishers (discovery under way): it may
        yet turn out to be the source's."""
        if self.fault is not None or role not in self.obeyed:
            return False
        return matched > self._identified.get(role, 0)

    def rogues(self) -> list[Publisher]:
        """The publishers other than the source on any command topic now."""
        return sorted(set().union(*self._rogues.values()), key=lambda p: (p.node, p.gid))

    def clear(self) -> str | None:
        """Operator recovery: clear the latched fault; why not (a rogue is still there), or
        None when cleared (or nothing was latched)."""
        rogues = self.rogues()
        if rogues:
            names = ", ".join(sorted({p.node for p in rogues}))
            return f"{ROGUE_PUBLISHER}: {names} still publishing on a driver command topic"
        self.fault = None
        return None


@dataclass
class Rearm:
    """After a recovery, the next accepted arm command must lie within `tolerance` of the
    measured position (`arm(measured)`); commands far from it are refused until one agrees."""

    tolerance: float = REARM_TOLERANCE
    _measured: np.ndarray | None = None

    @property
    def pending(self) -> bool:
        return self._measured is not None

    def arm(self, measured: Sequence[float]) -> None:
        self._measured = np.asarray(measured, dtype=float).copy()

    def check(self, target: Sequence[float] | None) -> str | None:
        """None when `target` (arm positions; None = unknown start, e.g. a stamped trajectory)
        may be followed, else why it is refused. Agreement ends the re-arm; malformed targets
        are left to the command's own checks."""
        if self._measured is None:
            return None
        if target is None:
            return "re-arming after recovery: the first command must start at the measured pose"
        target = np.asarray(target, dtype=float)
        if target.shape != self._measured.shape:
            return None
        distance = float(np.abs(target - self._measured).max())
        if not np.isfinite(distance) or distance > self.tolerance:
            return (
                f"re-arming after recovery: command {distance:.3f} rad from the measured pose "
                f"(> {self.tolerance:g}); send one that starts there"
            )
        self._measured = None
        return None


@dataclass
class StopLatch:
    """A UR robot stop (RTDE safety status bits): motion is held from the stop until the
    operator recovers after it has cleared; a stop clearing on its own resumes nothing."""

    monitor: StopMonitor = field(default_factory=StopMonitor)
    latched: str | None = None  # the stop being held, active or cleared

    @property
    def may_move(self) -> bool:
        return self.latched is None

    def update(self, bits: int) -> tuple[str, str] | None:
        """("stopped", reason) when a stop starts, ("cleared", reason) when it clears (the
        arm still holds), else None."""
        change = self.monitor.update(bits)
        if change is not None and change[0] == "stopped":
            self.latched = change[1]
        return change

    def recover(self) -> str | None:
        """Operator recovery: why not (the stop is still active), or None when motion may
        resume (after re-uploading the control script, from the measured pose)."""
        if self.monitor.stopped is not None:
            return f"{self.monitor.stopped} still active: clear it on the pendant first"
        self.latched = None
        return None
