"""`OpenpiServer`: one policy served over openpi's websocket protocol (`openpi_protocol`), so
`openpi-client`'s `WebsocketClientPolicy` and openpi-based robot code drive it unchanged.

The same bounds as the ZeroMQ server: a message over `wire.MAX_MESSAGE_BYTES` closes the
connection before it is buffered, messages are unpacked within `packed`'s limits, at most
`max_sessions` clients are connected (more get HTTP 503), at most `max_queue` requests wait for
the policy (more are answered `overloaded`), an idle connection is closed after
`session_idle_s`, and an error reaches the client as one line, never a traceback. Each
connection has its own policy state (caches, noise RNG); with API keys a robot keeps its
session across reconnects. Off loopback, TLS and API keys are both required.
"""

from __future__ import annotations

import http
import itertools
import logging
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.sync.server import Server, ServerConnection, serve

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeModeError
from vla_runtime.engine.policy import Observation, PolicyError
from vla_runtime.engine.remote import openpi_protocol as op
from vla_runtime.engine.remote import packed, wire
from vla_runtime.engine.remote.keys import ApiKeyStore, is_loopback_host
from vla_runtime.engine.remote.protocol import mode_from_wire, mode_to_wire, spec_hash
from vla_runtime.engine.remote.sessions import ServerLimits, SessionTable

log = logging.getLogger(__name__)
# websockets logs every connection at INFO; this server logs its own sessions
logging.getLogger(f"{__name__}.websockets").setLevel(logging.WARNING)


class BadRequest(ValueError):
    pass


class OpenpiServer:
    """Serve `policy` on ws(s)://`host`:`port` (port 0: any free one; see `port`)."""

    def __init__(
        self,
        policy,
        host: str = "127.0.0.1",
        port: int = op.DEFAULT_PORT,
        seed: int = 0,
        limits: ServerLimits = ServerLimits(),
        api_keys: str | Path | None = None,
        tls: ssl.SSLContext | None = None,
        threads: int | None = None,
    ):
        if not is_loopback_host(host) and (tls is None or api_keys is None):
            raise ValueError(
                f"refusing to serve openpi on {host} without TLS and API keys: anything but "
                "loopback needs --tls-cert/--tls-key and --api-keys FILE"
            )
        self.policy, self.limits, self.threads = policy, limits, threads
        self._api_keys = None if api_keys is None else ApiKeyStore(api_keys, "Api-Key")
        spec = policy.spec
        self.spec_hash = spec_hash(spec.to_dict())
        self.metadata = {
            op.METADATA_KEY: {
                "protocol": op.PROTOCOL,
                "spec": spec.to_dict(),
                "spec_hash": self.spec_hash,
            },
            "action_horizon": spec.chunk_len,
            "action_dim": spec.action_dim,
            "observation_keys": {
                "images": [op.image_key(c.name) for c in spec.cameras],
                "state": op.STATE_KEY,
                "prompt": op.PROMPT_KEY,
            },
        }
        self._cameras = [(op.image_key(c.name), c) for c in spec.cameras]
        self._sessions = SessionTable(policy, seed, limits)  # robot or connection
        self._connected = 0
        self._waiting = 0
        self._state_lock = threading.Lock()
        self._policy_lock = threading.Lock()  # one accelerator, one model: one at a time
        self._connections = itertools.count(1)
        self._errors = itertools.count(1)
        self.counters = {"served": 0, "refused": 0, "overloaded": 0}
        self._server: Server = serve(
            self._handle,
            host,
            port,
            compression=None,
            max_size=wire.MAX_MESSAGE_BYTES,
            max_queue=2,  # frames buffered per connection before reading pauses
            process_request=self._admit,
            ssl=tls,
            logger=logging.getLogger(f"{__name__}.websockets"),
        )
        self.port = self._server.socket.getsockname()[1]
        self.url = f"{'wss' if tls else 'ws'}://{host}:{self.port}"
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------

    def serve(self, stop: threading.Event | None = None) -> None:
        """Serve until `stop` is set (or `shutdown()`)."""
        if stop is not None:
            threading.Thread(target=lambda: (stop.wait(), self.stop()), daemon=True).start()
        self._server.serve_forever()

    def start(self) -> OpenpiServer:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="openpi-server")  # fmt: skip
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> OpenpiServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- connections -----------------------------------------------------------------------

    def _admit(self, connection: ServerConnection, request):
        """Before the handshake: health check, API key, connection cap."""
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self._api_keys is not None and self._robot_of(request) is None:
            self.counters["refused"] += 1
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "API key not allowed\n")
        if self._connected >= self.limits.max_sessions:
            self.counters["overloaded"] += 1
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"overloaded: {self._connected} clients connected\n",
            )
        return None

    def _robot_of(self, request) -> str | None:
        return self._api_keys.robot_for(request.headers.get("Authorization"))

    def _handle(self, ws: ServerConnection) -> None:
        robot = None
        if self._api_keys is not None:
            robot = self._robot_of(ws.request)
        name = robot or f"connection-{next(self._connections)}"
        with self._state_lock:
            self._connected += 1
            admitted = self._connected <= self.limits.max_sessions
        try:
            if not admitted:  # handshakes that raced past the check in `_admit`
                self.counters["overloaded"] += 1
                ws.close(CloseCode.TRY_AGAIN_LATER, "overloaded")
                return
            policy = self._open_session(name)
            ws.send(packed.pack(self.metadata))
            log.info("%s connected", name)
            while True:
                try:
                    message = ws.recv(timeout=self.limits.session_idle_s)
                except TimeoutError:
                    ws.close(reason="idle")
                    return
                ws.send(self._answer(policy, message, name))
        except (ConnectionClosed, OSError):  # the client went away
            pass
        finally:
            with self._state_lock:
                self._connected -= 1
                if robot is None:
                    self._sessions.drop(name)
            log.info("%s disconnected", name)

    def _open_session(self, name: str):
        with self._state_lock:
            return self._sessions.open(name)[0].policy

    # -- requests --------------------------------------------------------------------------

    def _answer(self, policy, message, name: str) -> bytes | str:
        arrived = time.perf_counter()
        try:
            if isinstance(message, str):
                raise BadRequest("expected a binary msgpack frame")
            request = packed.unpack(message)
            observation, mode, plan = self._parse(request)
        except (wire.WireError, BadRequest, ComputeModeError) as exc:
            self.counters["refused"] += 1
            return op.error_text("bad_request", str(exc))
        decode_ms = (time.perf_counter() - arrived) * 1e3
        with self._state_lock:
            if self._waiting >= self.limits.max_queue:
                self.counters["overloaded"] += 1
                return op.error_text("overloaded", f"{self._waiting} requests waiting")
            self._waiting += 1
        try:
            with self._policy_lock:
                queued = time.perf_counter()
                chunk = policy.infer(observation, mode, plan)
                done = time.perf_counter()
        except PolicyError as exc:
            return op.error_text("policy", str(exc))
        except Exception:  # never a traceback to a client
            ref = next(self._errors)
            log.exception("internal error #%d on a request from %s", ref, name)
            return op.error_text("internal", f"internal server error (server log #{ref})")
        finally:
            with self._state_lock:
                self._waiting -= 1
        self.counters["served"] += 1
        return packed.pack({
            op.ACTIONS_KEY: np.asarray(chunk.actions, dtype=np.float32),
            op.STAMP_KEY: float(chunk.stamp),
            op.MODE_KEY: mode_to_wire(chunk.mode),
            "server_timing": {
                "decode_ms": decode_ms,
                "queue_ms": (queued - arrived) * 1e3 - decode_ms,
                "infer_ms": (done - queued) * 1e3,
            },
        })  # fmt: skip

    def _parse(self, request: Any) -> tuple[Observation, Any, np.ndarray | None]:
        if not isinstance(request, dict):
            raise BadRequest(f"observation must be a map, got {type(request).__name__}")
        images = {}
        for key, camera in self._cameras:
            image = request.get(key)
            if not isinstance(image, np.ndarray):
                raise BadRequest(f"missing image array {key!r}")
            images[camera.name] = image
        state = request.get(op.STATE_KEY)
        if not isinstance(state, np.ndarray):
            raise BadRequest(f"missing state array {op.STATE_KEY!r}")
        prompt = request.get(op.PROMPT_KEY, "")
        if not isinstance(prompt, str):
            raise BadRequest(f"{op.PROMPT_KEY!r} must be a string")
        stamp = request.get(op.STAMP_KEY, 0.0)
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not np.isfinite(stamp):
            raise BadRequest(f"{op.STAMP_KEY!r} must be a finite number")
        mode = request.get(op.MODE_KEY)
        try:
            mode = FULL_COMPUTE if mode is None else mode_from_wire(mode)
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"{op.MODE_KEY!r}: {exc}") from None
        plan = request.get(op.PLAN_KEY)
        if plan is not None and not isinstance(plan, np.ndarray):
            raise BadRequest(f"{op.PLAN_KEY!r} must be an array")
        return Observation(images, state, prompt, float(stamp)), mode, plan
