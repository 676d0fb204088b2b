"""`RemoteClient`: a DEALER socket implementing the `Policy` protocol against a `PolicyServer`;
its session logic and reply checks (`SessionClient`) are shared with the Ray Serve client."""

from __future__ import annotations

import itertools
import math
import threading
import time
import uuid
from typing import Any

import numpy as np
import zmq

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode
from vla_runtime.engine.policy import ActionChunk, Observation, PolicyError, PolicySpec
from vla_runtime.engine.remote import wire
from vla_runtime.engine.remote.protocol import (
    DEFAULT_ENDPOINT,
    RemoteError,
    RemoteOverloaded,
    RemoteRejected,
    RemoteUnavailable,
    mode_from_wire,
    mode_to_wire,
    pinned,
    spec_hash,
)


class SessionClient:
    """A `Policy` whose infer() runs on a server of our protocol (hello, then infer in a
    session); subclasses carry the messages (`_request`, `_drop_transport`).

    Trust on first use: `spec` comes from the first handshake and its hash is pinned (or given
    as `expected_spec_hash`); a later handshake with another policy is refused, so a process
    that takes the port over cannot become the policy. Pass `expected_spec` to have the server
    refuse a different policy outright. Every reply is checked before it becomes a chunk: its
    request id, the chunk's shape and dtype against the spec, finite actions, the observation's
    stamp."""

    def __init__(
        self,
        endpoint: str,
        robot: str | None,
        timeout_s: float,
        expected_spec: PolicySpec | None,
        expected_spec_hash: str | None,
    ):
        self.endpoint = endpoint
        self.timeout_s = float(timeout_s)
        self.expected_spec = expected_spec
        self.robot = robot or f"client-{uuid.uuid4().hex[:12]}"
        self.pinned_spec_hash = expected_spec_hash
        self._session_open = False
        self._sent_instruction: str | None = None
        self._spec: PolicySpec | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.last_round_trip_ms = float("nan")

    def _connect_now(self) -> None:
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
                self._hello()  # the server restarted behind the same socket
                reply = self._request(self._infer_request(observation, compute_mode, plan))
            if not reply["ok"]:
                kind, message = reply.get("kind"), reply.get("error", "?")
                if kind in ("policy", "bad_request"):
                    raise PolicyError(f"remote policy rejected the observation: {message}")
                if kind in ("version", "spec", "unauthorized"):
                    self._session_open = False
                    raise RemoteRejected(message)
                if kind == "overloaded":
                    raise RemoteOverloaded(f"{self.endpoint} is overloaded: {message}")
                raise RemoteError(f"remote server error ({kind}): {message}")
            self._sent_instruction = observation.instruction
            return self._chunk_from(reply, observation)

    def close(self) -> None:
        with self._lock:
            self._drop_transport()

    def __enter__(self) -> SessionClient:
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
            spec = self._spec
            expected = (spec.chunk_len, spec.action_dim)
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
            served_ms = sum(server_timing.values())
            timings["transport"] = max(self.last_round_trip_ms - served_ms, 0.0)
            info = {k: float(v) for k, v in dict(reply.get("info", {})).items()}
            info.update({f"server_{k}_ms": v for k, v in server_timing.items()})
            return ActionChunk(
                actions=actions.astype(np.float32),  # a writable copy, out of the frame
                stamp=stamp,
                mode=mode_from_wire(reply["mode"]),
                timings_ms=timings,
                info=info,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteError(f"reply from {self.endpoint} refused: {exc}") from None

    def _hello(self) -> None:
        self._session_open = False
        self._sent_instruction = None
        request: dict[str, Any] = {"op": "hello", "robot": self.robot}
        if self.expected_spec is not None:
            request["expected_spec"] = self.expected_spec.to_dict()
        reply = self._request(request)
        if not reply["ok"]:
            raise RemoteRejected(f"{self.endpoint} refused the session: {reply.get('error')}")
        try:
            served = spec_hash(reply["spec"])
            spec = PolicySpec.from_dict(reply["spec"])
        except Exception as exc:
            raise RemoteError(f"unreadable spec from {self.endpoint}: {exc}") from None
        try:
            self.pinned_spec_hash = pinned(self.pinned_spec_hash, served, self.endpoint)
        except RemoteRejected:
            self._drop_transport()
            raise
        self._spec = spec
        self._session_open = True

    def _request(self, body: dict) -> dict:
        """Send `body` (with protocol version and a fresh request id), return our reply."""
        raise NotImplementedError

    def _drop_transport(self) -> None:
        raise NotImplementedError


class RemoteClient(SessionClient):
    """A `Policy` whose infer() runs on a `PolicyServer` (ZeroMQ DEALER socket).

    Every request waits at most `timeout_s`; on a timeout the socket is closed and the next
    call opens a new one (and says hello again as the same `robot`, so the server gives it its
    session back), so a restarted server is picked up without recreating the client. With
    CURVE the server's key is pinned by the key bundle itself."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        server_public_key: bytes | str | None = None,
        client_keys: tuple[bytes, bytes] | None = None,
        timeout_s: float = 2.0,
        expected_spec: PolicySpec | None = None,
        connect: bool = True,
        robot: str | None = None,
        expected_spec_hash: str | None = None,
    ):
        super().__init__(endpoint, robot, timeout_s, expected_spec, expected_spec_hash)
        self._server_key = (
            server_public_key.encode() if isinstance(server_public_key, str) else server_public_key
        )
        if self._server_key is not None and client_keys is None:
            client_keys = zmq.curve_keypair()  # the server may allow any client key
        self._client_keys = client_keys
        self._ctx = zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        if connect:
            self._connect_now()

    def _request(self, body: dict) -> dict:
        socket = self._ensure_socket()
        request_id = next(self._ids)
        frames = wire.encode({"v": wire.PROTOCOL_VERSION, "id": request_id, **body})
        started = time.perf_counter()
        try:
            socket.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._drop_transport()
            raise RemoteUnavailable(f"cannot send to {self.endpoint}: queue full") from None
        deadline = started + self.timeout_s
        while True:
            remaining_ms = int((deadline - time.perf_counter()) * 1e3)
            if remaining_ms <= 0 or not socket.poll(remaining_ms, zmq.POLLIN):
                self._drop_transport()
                raise RemoteUnavailable(
                    f"no reply from {self.endpoint} within {self.timeout_s:g} s (server down, "
                    "overloaded, or CURVE keys not accepted); reconnecting on the next call"
                )
            try:
                reply = wire.decode(socket.recv_multipart(copy=False))
            except wire.WireError as exc:
                raise RemoteError(f"malformed reply from {self.endpoint}: {exc}") from exc
            if reply.get("v") != wire.PROTOCOL_VERSION:
                self._drop_transport()
                raise RemoteRejected(
                    f"protocol version mismatch: server speaks v{reply.get('v')}, client "
                    f"speaks v{wire.PROTOCOL_VERSION}; install the same vla_runtime on both ends"
                )
            if reply.get("id") == request_id and isinstance(reply.get("ok"), bool):
                self.last_round_trip_ms = (time.perf_counter() - started) * 1e3
                return reply
            # A late reply to an earlier request, or one to nobody: skip it, wait for ours.

    def _ensure_socket(self) -> zmq.Socket:
        if self._socket is None:
            socket = self._ctx.socket(zmq.DEALER)
            socket.linger = 0
            socket.setsockopt(zmq.SNDHWM, 4)  # never queue a backlog of stale observations
            if self._server_key is not None:
                socket.curve_serverkey = self._server_key
                socket.curve_publickey, socket.curve_secretkey = self._client_keys
            socket.connect(self.endpoint)
            self._socket = socket
            self._session_open = False
        return self._socket

    def _drop_transport(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        self._session_open = False
