"""`PolicyServer`: a ROUTER socket serving one policy to many robots, one session per robot
(`vla-runtime serve`, `serve_cli`).

Nothing a client sends can grow the server without bound: a message is refused by its frames'
sizes before it is read (`wire.check_size`, and libzmq drops a peer whose frame exceeds
`wire.MAX_MESSAGE_BYTES`), headers are unpacked within fixed limits, at most `max_queue`
requests wait (more are answered `overloaded` at once), and at most `max_sessions` robots hold a
session (idle ones expire, then the least recently seen is dropped; its robot says hello again).
A session belongs to a robot, not to a socket: a robot that reconnects gets its session back.
With CURVE, the robot is the name its key has in the allow-list, re-read every second, so a
revoked robot is refused on its next request. A client never sees a traceback or exception text
from the server: an internal error is answered with a reference to the server's log line."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq
from zmq.auth.thread import ThreadAuthenticator

from vla_runtime.core.compute_mode import ComputeModeError
from vla_runtime.engine.policy import PolicyError
from vla_runtime.engine.remote import wire
from vla_runtime.engine.remote.keys import (
    ROBOT_NAME,
    FileWatch,
    allowed_robots,
    is_loopback,
)
from vla_runtime.engine.remote.protocol import (
    DEFAULT_BIND,
    error_reply,
    float_map,
    mode_to_wire,
    ok_reply,
    parse_infer,
    spec_hash,
    version_refusal,
)
from vla_runtime.engine.remote.sessions import (
    ServerLimits,
    Session,
    SessionTable,
    spec_refusal,
)

log = logging.getLogger(__name__)

PEER_QUEUE_DEPTH = 4  # messages libzmq buffers per connected peer (RCVHWM)


@dataclass
class _Pending:
    identity: bytes
    request: dict
    robot: str | None  # authenticated robot name (CURVE); None on loopback
    arrived: float
    decode_ms: float


class PolicyServer:
    """Serve `policy` on `bind`. Use `serve(stop_event)` in the foreground or `start()`/`stop()`.

    Requests are handled one at a time, in arrival order (one accelerator, one model).
    Per-robot state: a policy with `reset()` (the caching back ends) is shallow-copied for each
    session and the copy reset (and `reseed(seed)`): weights and runtime sessions are shared,
    caches and RNG are not. Other policies are shared as they are (stateless).

    With `curve_secret`, only robots whose public key is in `authorized_clients` (a directory
    of `<robot>.key` files) are served; a missing or empty directory refuses everyone."""

    def __init__(
        self,
        policy,
        bind: str = DEFAULT_BIND,
        curve_secret: bytes | str | None = None,
        authorized_clients: str | Path | None = None,
        seed: int = 0,
        limits: ServerLimits = ServerLimits(),
        threads: int | None = None,
    ):
        if curve_secret is None and not is_loopback(bind):
            raise ValueError(
                f"refusing to serve on {bind} without CURVE keys: anything but loopback needs "
                "authentication (create keys with `vla-runtime serve --gen-keys DIR`, add robots "
                "with `--add-robot NAME`, then pass `--curve-keys DIR`), or bind "
                "tcp://127.0.0.1:PORT"
            )
        self.policy, self.limits, self.threads = policy, limits, threads
        self._seed = seed
        self._spec_dict = policy.spec.to_dict()
        self.spec_hash = spec_hash(self._spec_dict)
        self._sessions = SessionTable(policy, seed, limits)
        self._robot_of: dict[bytes, str] = {}  # socket identity -> robot of a live session
        self._queue: deque[_Pending] = deque()
        self._errors = itertools.count(1)
        self.counters = {"served": 0, "refused": 0, "overloaded": 0}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._auth = None
        self._allow_list: Path | None = None
        self._allowed: dict[str, str] = {}
        self._socket = self._ctx.socket(zmq.ROUTER)
        self._socket.linger = 0
        self._socket.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.RCVHWM, PEER_QUEUE_DEPTH)
        try:
            if curve_secret is not None:
                self._enable_curve(curve_secret, authorized_clients)
            self._socket.bind(bind)
        except Exception:
            self.close()
            raise
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.secure = curve_secret is not None

    def _enable_curve(self, secret: bytes | str, authorized_clients: str | Path | None) -> None:
        secret = secret.encode() if isinstance(secret, str) else secret
        self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger(f"{__name__}.auth"))
        self._auth.start()
        self._allow_list = Path(authorized_clients) if authorized_clients else None
        self._allow_watch = FileWatch(
            lambda: self._allow_list.glob("*.key") if self._allow_list else []
        )
        self._reload_allow_list()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self)
        if not self._allowed:
            log.warning(
                "no robot keys in %s: every client is refused until one is added "
                "(`vla-runtime serve --curve-keys DIR --add-robot NAME`)",
                self._allow_list,
            )
        self._socket.curve_secretkey = secret
        self._socket.curve_publickey = zmq.curve_public(secret)
        self._socket.curve_server = True

    def _reload_allow_list(self) -> None:
        """Re-read the allow-list when its files changed (looked at once a second)."""
        if self._auth is None or not self._allow_watch.changed():
            return
        self._allowed = allowed_robots(self._allow_list) if self._allow_list else {}
        for robot in [r for r in self._sessions if r not in self._allowed.values()]:
            self._drop_session(robot)
            log.info("robot %s revoked: session closed", robot)

    def callback(self, domain: str, client_key: bytes) -> bool:
        """ZAP: admit a connecting client whose key (z85) is in the allow-list."""
        return client_key.decode("ascii", "replace") in self._allowed

    # -- loop ------------------------------------------------------------------------------

    def serve(self, stop: threading.Event | None = None, poll_ms: int = 100) -> None:
        stop = stop or self._stop
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not stop.is_set():
            self._reload_allow_list()
            if not self._queue and not poller.poll(poll_ms):
                continue
            self._receive_pending()
            if self._queue:
                pending = self._queue.popleft()
                self._send(pending.identity, self._handle_safely(pending))

    def _receive_pending(self) -> None:
        """Take every message libzmq holds: decoded into the queue, or answered at once."""
        while True:
            try:
                first = self._socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, frames, sizes, total = first.bytes, [], [], 0
            while self._socket.getsockopt(zmq.RCVMORE):
                frame = self._socket.recv(copy=False)
                sizes.append(len(frame))
                total += len(frame)
                if len(sizes) <= wire.MAX_FRAMES and total <= wire.MAX_MESSAGE_BYTES:
                    frames.append(frame)  # anything past a limit is let go at once
            started = time.perf_counter()
            try:
                wire.check_size(sizes)
                request = wire.decode(frames)
            except wire.WireError as exc:
                self.counters["refused"] += 1
                log.warning("malformed request from %s: %s", identity.hex(), exc)
                self._send(identity, error_reply(None, "bad_request", str(exc)))
                continue
            request_id = request.get("id")
            if len(self._queue) >= self.limits.max_queue:
                self.counters["overloaded"] += 1
                self._send(
                    identity,
                    error_reply(
                        request_id, "overloaded", f"{len(self._queue)} requests waiting; try again"
                    ),
                )
                continue
            robot = None
            if self.secure:
                robot = self._allowed.get(frames[0].get("User-Id"))
                if robot is None:
                    self.counters["refused"] += 1
                    self._send(
                        identity,
                        error_reply(request_id, "unauthorized", "this client's key is not allowed"),
                    )
                    continue
            decode_ms = (time.perf_counter() - started) * 1e3
            self._queue.append(_Pending(identity, request, robot, started, decode_ms))

    def _send(self, identity: bytes, reply: dict) -> None:
        try:
            self._socket.send_multipart([identity, *wire.encode(reply)], copy=False)
        except zmq.ZMQError as exc:
            log.warning("reply to %s dropped: %s", identity.hex(), exc)

    def _handle_safely(self, pending: _Pending) -> dict:
        try:
            return self.handle(pending)
        except Exception:  # never let one bad request take the server down, nor tell why
            ref = next(self._errors)
            log.exception("internal error #%d on a request from %s", ref, pending.identity.hex())
            return error_reply(
                pending.request.get("id"), "internal", f"internal server error (server log #{ref})"
            )

    def start(self) -> PolicyServer:
        self._thread = threading.Thread(target=self.serve, name="policy-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self.close()

    def close(self) -> None:
        if self._thread is not None:  # the loop owns the socket until it has ended
            self.stop()
            return
        if not self._socket.closed:
            self._socket.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if not self._ctx.closed:
            self._ctx.term()

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def client_count(self) -> int:
        return len(self._sessions)

    # -- requests --------------------------------------------------------------------------

    def handle(self, pending: _Pending) -> dict:
        """One decoded request -> its reply."""
        request, identity = pending.request, pending.identity
        queue_ms = (time.perf_counter() - pending.arrived) * 1e3 - pending.decode_ms
        request_id = request.get("id")
        if request.get("v") != wire.PROTOCOL_VERSION:
            return version_refusal(request)
        self._expire_sessions()
        op = request.get("op")
        if op == "hello":
            return self._hello(pending)
        if op != "infer":
            return error_reply(request_id, "bad_request", f"unknown op {str(op)[:40]!r}")
        robot = self._robot_of.get(identity)
        if robot is None or (pending.robot is not None and pending.robot != robot):
            return error_reply(request_id, "handshake_required", "unknown session: say hello")
        session = self._sessions.touch(robot)
        if session is None:
            return error_reply(request_id, "handshake_required", "unknown session: say hello")
        reply = self._infer(session, request)
        if reply["ok"]:
            reply["timing_ms"] = {
                "decode": pending.decode_ms,
                "queue": queue_ms,
                "infer": reply["timing_ms"]["infer"],
            }
        return reply

    def _hello(self, pending: _Pending) -> dict:
        request, identity = pending.request, pending.identity
        refusal = spec_refusal(request, self._spec_dict)
        if refusal is not None:
            return refusal
        robot = pending.robot
        if robot is None:  # loopback: the robot names itself, or is its socket
            claimed = request.get("robot")
            if claimed is not None and not (
                isinstance(claimed, str) and ROBOT_NAME.fullmatch(claimed)
            ):
                return error_reply(
                    request.get("id"), "bad_request", "robot: 1-64 letters, digits, '_', '.' or '-'"
                )
            robot = claimed or identity.hex()
        session, evicted = self._sessions.open(robot)
        if evicted is not None:
            self._robot_of.pop(evicted.identity, None)
        self._robot_of.pop(session.identity, None)  # the socket it spoke through before
        session.identity = identity
        self._robot_of[identity] = robot
        return ok_reply(request.get("id"), spec=self._spec_dict, spec_hash=self.spec_hash,
                        robot=robot, threads=self.threads)  # fmt: skip

    def _drop_session(self, robot: str) -> None:
        session = self._sessions.drop(robot)
        if session is not None:
            self._robot_of.pop(session.identity, None)

    def _expire_sessions(self) -> None:
        for session in self._sessions.expire():
            self._robot_of.pop(session.identity, None)

    def _infer(self, session: Session, request: dict) -> dict:
        request_id = request.get("id")
        try:
            observation, mode, plan = parse_infer(request, session.instruction)
        except PolicyError as exc:
            return error_reply(request_id, "policy", str(exc))
        except (KeyError, TypeError, ValueError, ComputeModeError) as exc:
            return error_reply(request_id, "bad_request", f"malformed infer request: {exc}")
        session.instruction = observation.instruction
        started = time.perf_counter()
        try:
            chunk = session.policy.infer(observation, mode, plan)
        except PolicyError as exc:
            return error_reply(request_id, "policy", str(exc))
        infer_ms = (time.perf_counter() - started) * 1e3
        self.counters["served"] += 1
        return ok_reply(
            request_id,
            actions=np.asarray(chunk.actions, dtype=np.float32),
            stamp=float(chunk.stamp),
            mode=mode_to_wire(chunk.mode),
            policy_timings_ms=float_map(chunk.timings_ms),
            info=float_map(chunk.info),
            timing_ms={"infer": infer_ms},
        )
