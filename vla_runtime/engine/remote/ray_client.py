"""`RayClient`: the `Policy` protocol against the Ray Serve ingress (`remote/ray_serve.py`).

Standard library only (http.client, one keep-alive connection), so a robot needs no Ray.
"""

from __future__ import annotations

import http.client
import itertools
import math
import ssl
import threading
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode
from vla_runtime.engine.policy import ActionChunk, Observation, PolicyError, PolicySpec
from vla_runtime.engine.remote import packed, wire
from vla_runtime.engine.remote.keys import check_robot_name
from vla_runtime.engine.remote.protocol import (
    RemoteError,
    RemoteOverloaded,
    RemoteRejected,
    RemoteUnavailable,
    mode_from_wire,
    mode_to_wire,
    spec_hash,
)
from vla_runtime.engine.remote.ray_serve import SESSION_HEADER

DEFAULT_URL = "http://127.0.0.1:8000/"
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class RayClient:
    """A `Policy` whose infer() runs on a Ray Serve replica, as robot `robot`.

    `token`: the robot's bearer token (the server's tokens file). `verify`: with https, True
    checks the server against the system CAs, a path against that CA file (a self-signed
    fleet CA); there is no unverified mode. Every request waits at most `timeout_s`; on a
    failure the connection is closed and the next call opens a new one (and says hello again).

    Trust on first use and reply checks as `RemoteClient`: the spec hash of the first hello is
    pinned (or `expected_spec_hash`), a reply must answer this request id, carry float actions
    of shape (chunk_len, action_dim), all finite, stamped like the observation."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        robot: str | None = None,
        token: str | None = None,
        timeout_s: float = 2.0,
        expected_spec: PolicySpec | None = None,
        expected_spec_hash: str | None = None,
        connect: bool = True,
        verify: bool | str = True,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host:port/, got {url!r}")
        if verify is False:
            raise ValueError("verify: True (system CAs) or a CA file; unverified TLS is refused")
        self.url = url
        self.robot = check_robot_name(robot or f"client-{uuid.uuid4().hex[:12]}")
        self.timeout_s = float(timeout_s)
        self.expected_spec = expected_spec
        self.pinned_spec_hash = expected_spec_hash
        self._host, self._path = parts.hostname, parts.path or "/"
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = None
        if parts.scheme == "https":
            self._tls = ssl.create_default_context(
                cafile=verify if isinstance(verify, str) else None
            )
        self._headers = {"Content-Type": "application/msgpack", "Connection": "keep-alive"}
        self._headers[SESSION_HEADER] = self.robot  # Ray's proxy routes the robot by it
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None
        self._session_open = False
        self._sent_instruction: str | None = None
        self._spec: PolicySpec | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.last_round_trip_ms = float("nan")
        self.last_replica: str | None = None  # the replica that answered last
        if connect:
            with self._lock:
                self._hello()

    @property
    def spec(self) -> PolicySpec:
        if self._spec is None:
            with self._lock:
                if self._spec is None:
                    self._hello()
        return self._spec

    def infer(
        self,
        observation: Observation,
        compute_mode: ComputeMode = FULL_COMPUTE,
        plan: np.ndarray | None = None,
        noise_scale: float | None = None,  # the server samples with its own noise
    ) -> ActionChunk:
        with self._lock:
            if not self._session_open:
                self._hello()
            reply = self._request(self._infer_request(observation, compute_mode, plan))
            if not reply["ok"] and reply.get("kind") == "handshake_required":
                self._hello()  # the replica restarted, or the robot was moved to another
                reply = self._request(self._infer_request(observation, compute_mode, plan))
            if not reply["ok"]:
                kind, message = reply.get("kind"), reply.get("error", "?")
                if kind in ("policy", "bad_request"):
                    raise PolicyError(f"remote policy rejected the observation: {message}")
                if kind in ("version", "spec", "unauthorized"):
                    self._session_open = False
                    raise RemoteRejected(message)
                if kind == "overloaded":
                    raise RemoteOverloaded(f"{self.url} is overloaded: {message}")
                raise RemoteError(f"remote server error ({kind}): {message}")
            self._sent_instruction = observation.instruction
            return self._chunk_from(reply, observation)

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

    def __enter__(self) -> RayClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _infer_request(self, observation: Observation, mode: ComputeMode, plan) -> dict:
        request = {
            "op": "infer",
            "images": {name: np.asarray(image) for name, image in observation.images.items()},
            "state": np.asarray(observation.state),
            "stamp": float(observation.stamp),
            "mode": mode_to_wire(mode),
        }
        if observation.instruction != self._sent_instruction:
            request["instruction"] = observation.instruction
        if plan is not None:
            request["plan"] = np.asarray(plan)
        return request

    def _chunk_from(self, reply: dict, observation: Observation) -> ActionChunk:
        try:
            actions = reply["actions"]
            expected = (self._spec.chunk_len, self._spec.action_dim)
            if not isinstance(actions, np.ndarray) or actions.dtype.kind != "f":
                raise ValueError("actions are not a float array")
            if actions.shape != expected:
                raise ValueError(f"actions of shape {actions.shape}, the spec says {expected}")
            if not np.all(np.isfinite(actions)):
                raise ValueError("non-finite actions")
            stamp = float(reply["stamp"])
            if not math.isclose(stamp, float(observation.stamp), abs_tol=1e-9):
                raise ValueError(
                    f"stamp {stamp} answers another observation ({float(observation.stamp)})"
                )
            server_timing = {k: float(v) for k, v in dict(reply["timing_ms"]).items()}
            timings = {k: float(v) for k, v in dict(reply.get("policy_timings_ms", {})).items()}
            timings["transport"] = max(self.last_round_trip_ms - sum(server_timing.values()), 0.0)
            info = {k: float(v) for k, v in dict(reply.get("info", {})).items()}
            info.update({f"server_{k}_ms": v for k, v in server_timing.items()})
            return ActionChunk(
                actions=actions.astype(np.float32),  # a writable copy
                stamp=stamp,
                mode=mode_from_wire(reply["mode"]),
                timings_ms=timings,
                info=info,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteError(f"reply from {self.url} refused: {exc}") from None

    def _hello(self) -> None:
        self._session_open = False
        self._sent_instruction = None
        request: dict[str, Any] = {"op": "hello"}
        if self.expected_spec is not None:
            request["expected_spec"] = self.expected_spec.to_dict()
        reply = self._request(request)
        if not reply["ok"]:
            raise RemoteRejected(f"{self.url} refused the session: {reply.get('error')}")
        try:
            served = spec_hash(reply["spec"])
            spec = PolicySpec.from_dict(reply["spec"])
        except Exception as exc:
            raise RemoteError(f"unreadable spec from {self.url}: {exc}") from None
        if self.pinned_spec_hash is None:
            self.pinned_spec_hash = served
        elif served != self.pinned_spec_hash:
            self._drop_connection()
            raise RemoteRejected(
                f"{self.url} now serves policy {served}, not the pinned "
                f"{self.pinned_spec_hash}: refusing it"
            )
        self._spec = spec
        self._session_open = True

    def _request(self, body: dict) -> dict:
        request_id = next(self._ids)
        data = packed.pack({"v": wire.PROTOCOL_VERSION, "id": request_id, "robot": self.robot,
                            **body})  # fmt: skip
        started = time.perf_counter()
        raw = self._post(data)
        try:
            reply = packed.unpack(raw)
        except wire.WireError as exc:
            self._drop_connection()
            raise RemoteError(f"malformed reply from {self.url}: {exc}") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self._drop_connection()
            raise RemoteError(f"malformed reply from {self.url}: not a reply map")
        if reply.get("v") != wire.PROTOCOL_VERSION:
            self._drop_connection()
            raise RemoteRejected(
                f"protocol version mismatch: server speaks v{str(reply.get('v'))[:10]}, client "
                f"speaks v{wire.PROTOCOL_VERSION}; install the same vla_runtime on both ends"
            )
        # Errors refused before the body was read answer no id; anything else must be ours.
        if reply.get("id") != request_id and not (not reply["ok"] and reply.get("id") is None):
            self._drop_connection()
            raise RemoteError(f"reply from {self.url} answers request {reply.get('id')!r}")
        self.last_round_trip_ms = (time.perf_counter() - started) * 1e3
        replica = reply.get("replica")
        self.last_replica = replica if isinstance(replica, str) else None
        return reply

    def _post(self, data: bytes) -> bytes:
        """POST `data`, return the reply body; a keep-alive connection the server closed while
        idle is reopened once."""
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._connection()
            try:
                conn.request("POST", self._path, body=data, headers=self._headers)
                response = conn.getresponse()
                length = response.getheader("Content-Length")
                if length is not None and (
                    not length.isdigit() or int(length) > wire.MAX_MESSAGE_BYTES
                ):
                    raise RemoteError(f"reply from {self.url} over {wire.MAX_MESSAGE_BYTES} bytes")
                raw = response.read(wire.MAX_MESSAGE_BYTES + 1)
                if response.getheader("Content-Type", "") != "application/msgpack":
                    if response.status == 503:  # Ray's proxy: the replica's queue is full
                        raise RemoteOverloaded(f"{self.url} is overloaded (HTTP 503)")
                    raise RemoteError(
                        f"{self.url} answered HTTP {response.status} without a policy reply"
                    )
                if response.will_close:
                    self._drop_connection()
                return raw
            except _STALE:
                self._drop_connection()
                if attempt or not reused:
                    raise RemoteUnavailable(f"{self.url} closed the connection") from None
            except (TimeoutError, OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                raise RemoteUnavailable(
                    f"no reply from {self.url} within {self.timeout_s:g} s "
                    f"({wire.first_line(exc)}); reconnecting on the next call"
                ) from None
            except RemoteError:
                self._drop_connection()
                raise
        raise AssertionError("unreachable")

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._tls is not None:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout_s, context=self._tls
                )
            else:
                self._conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=self.timeout_s
                )
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
