"""Per-robot sessions of a policy server (ZeroMQ `PolicyServer`, `OpenpiServer`, Ray Serve
`PolicyReplica`).

A session is a robot's own policy state: a stateful (caching) back end is shallow-copied and
reset per robot, so weights and runtime sessions are shared but KV caches, the previous chunk
and the noise RNG are not. At most `max_sessions` robots hold one; a session idle for
`session_idle_s` expires, and a new robot evicts the least recently seen one (that robot says
hello again on its next request). A robot that says hello again keeps its session, caches reset.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vla_runtime.engine.remote.protocol import error_reply, spec_mismatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    max_sessions: int = 32
    session_idle_s: float = 120.0
    max_queue: int = 8  # requests waiting for the policy


@dataclass
class Session:
    robot: str
    policy: Any
    identity: bytes = b""  # ZeroMQ: the socket the robot speaks through now
    instruction: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    requests: int = 0


def session_policy(policy, seed: int):
    """One robot's policy (see the module doc); a stateless policy is shared as it is."""
    if not callable(getattr(policy, "reset", None)):
        return policy
    policy = copy.copy(policy)
    policy.reset()
    if callable(getattr(policy, "reseed", None)):
        policy.reseed(seed)
    return policy


class SessionTable:
    """robot -> Session, least recently seen first."""

    def __init__(self, policy, seed: int, limits: ServerLimits):
        self.policy, self.seed, self.limits = policy, seed, limits
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._sessions))

    def touch(self, robot: str) -> Session | None:
        """The robot's session, marked as seen now; None when it has none (say hello)."""
        session = self._sessions.get(robot)
        if session is not None:
            session.last_seen = time.monotonic()
            session.requests += 1
            self._sessions.move_to_end(robot)
        return session

    def open(self, robot: str) -> tuple[Session, Session | None]:
        """(the robot's session, a session evicted to make room or None). A robot seen before
        gets its own back with its caches reset and no instruction."""
        session, evicted = self._sessions.get(robot), None
        if session is None:
            if len(self._sessions) >= self.limits.max_sessions:
                _, evicted = self._sessions.popitem(last=False)
                self.evicted += 1
                log.info(
                    "session of %s evicted (limit %d)", evicted.robot, self.limits.max_sessions
                )
            session = Session(robot, session_policy(self.policy, self.seed))
            self._sessions[robot] = session
            log.info("robot %s connected (%d sessions)", robot, len(self._sessions))
        else:
            session.instruction = ""
            if callable(getattr(session.policy, "reset", None)):
                session.policy.reset()
        session.last_seen = time.monotonic()
        self._sessions.move_to_end(robot)
        return session, evicted

    def drop(self, robot: str) -> Session | None:
        return self._sessions.pop(robot, None)

    def expire(self) -> list[Session]:
        """Drop and return the sessions idle for longer than the limit."""
        now = time.monotonic()
        idle = [
            r for r, s in self._sessions.items() if now - s.last_seen > self.limits.session_idle_s
        ]
        return [self._sessions.pop(robot) for robot in idle]


def spec_refusal(request: dict, spec: dict) -> dict | None:
    """The refusal of a hello whose client expects another policy than `spec`, else None."""
    expected = request.get("expected_spec")
    mismatch = spec_mismatch(expected, spec) if expected is not None else ""
    if not mismatch:
        return None
    return error_reply(
        request.get("id"),
        "spec",
        f"policy spec mismatch (client expects vs server serves): {mismatch}",
    )
