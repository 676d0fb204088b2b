"""`OpenpiPolicy`: the engine's `openpi` back end, a `Policy` whose chunks come from an openpi
policy server (openpi's `serve_policy.py` serving pi0 / pi0.5, or `vla-runtime serve --protocol
openpi`), so they go through the same safety node and streamer as a local policy's.

The server's policy spec comes from its metadata when it is vla_runtime; any other openpi server
is described by `spec` (a checkpoint's spec.json: cameras, state and action sizes, horizon, dt,
action space) and the observation keys its policy expects. Every reply is checked before it
becomes a chunk: a float (H', A) array with A = action_dim and H' >= chunk_len (the first
chunk_len rows are kept, as openpi's action broker executes a prefix), finite, and, from our
server, the observation's stamp. A timeout drops the connection, so a late reply can never
answer a later request; the next call reconnects and the server's identity (spec hash, or its
metadata for another server) must be the one pinned on first use.
"""

from __future__ import annotations

import json
import math
import ssl
import threading
import time
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode
from vla_runtime.engine.policy import ActionChunk, Observation, PolicyError, PolicySpec
from vla_runtime.engine.remote import openpi_protocol as op
from vla_runtime.engine.remote import packed, wire
from vla_runtime.engine.remote.protocol import (
    RemoteError,
    RemoteOverloaded,
    RemoteRejected,
    RemoteUnavailable,
    mode_from_wire,
    mode_to_wire,
    pinned,
    spec_hash,
)


class OpenpiPolicy:
    def __init__(
        self,
        url: str = f"ws://127.0.0.1:{op.DEFAULT_PORT}",
        spec: PolicySpec | None = None,
        image_keys: list[str] | tuple[str, ...] = (),
        state_key: str = op.STATE_KEY,
        prompt_key: str = op.PROMPT_KEY,
        api_key: str | None = None,
        timeout_s: float = 2.0,
        connect_now: bool = True,
        tls_ca: str | None = None,
    ):
        if not url.startswith(("ws://", "wss://")):
            raise ValueError(f"openpi server URL must start with ws:// or wss://, got {url!r}")
        self.url, self.timeout_s = url, float(timeout_s)
        self._fallback_spec, self._image_keys = spec, tuple(image_keys)
        self._state_key, self._prompt_key = state_key, prompt_key
        self._headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        self._tls_ca = tls_ca
        self._ws: ClientConnection | None = None
        self._spec: PolicySpec | None = None
        self._ours = False  # the server is vla_runtime: stamps, compute modes and plans
        self.pinned_identity: str | None = None
        self.server_metadata: dict = {}
        self._lock = threading.Lock()
        self.last_round_trip_ms = float("nan")
        if connect_now:
            with self._lock:
                self._connect()

    @property
    def spec(self) -> PolicySpec:
        with self._lock:
            if self._spec is None:
                self._connect()
            return self._spec

    def infer(
        self,
        observation: Observation,
        compute_mode: ComputeMode = FULL_COMPUTE,
        plan: np.ndarray | None = None,
        noise_scale: float | None = None,  # the server samples with its own noise
    ) -> ActionChunk:
        with self._lock:
            if self._ws is None:
                self._connect()
            request = self._request(observation, compute_mode, plan)
            started = time.perf_counter()
            reply = self._exchange(packed.pack(request))
            self.last_round_trip_ms = (time.perf_counter() - started) * 1e3
            if isinstance(reply, str):
                kind, message = op.parse_error(reply)
                if kind in ("policy", "bad_request"):
                    raise PolicyError(f"openpi server rejected the observation: {message}")
                if kind == "overloaded":
                    raise RemoteOverloaded(f"{self.url} is overloaded: {message}")
                raise RemoteError(f"openpi server error ({kind}): {message}")
            return self._chunk_from(reply, observation)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __enter__(self) -> OpenpiPolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _request(self, observation: Observation, mode: ComputeMode, plan) -> dict[str, Any]:
        spec = self._spec
        keys = self._image_keys or tuple(op.image_key(c.name) for c in spec.cameras)
        request: dict[str, Any] = {
            key: np.asarray(observation.images[camera.name])
            for key, camera in zip(keys, spec.cameras, strict=True)
        }
        request[self._state_key] = np.asarray(observation.state, np.float32)
        request[self._prompt_key] = observation.instruction
        if self._ours:
            request[op.STAMP_KEY] = float(observation.stamp)
            request[op.MODE_KEY] = mode_to_wire(mode)
            if plan is not None:
                request[op.PLAN_KEY] = np.asarray(plan, np.float32)
        return request

    def _chunk_from(self, reply: Any, observation: Observation) -> ActionChunk:
        try:
            if not isinstance(reply, dict):
                raise ValueError(f"reply is a {type(reply).__name__}, not a map")
            actions = reply[op.ACTIONS_KEY]
            spec = self._spec
            if not isinstance(actions, np.ndarray) or actions.dtype.kind != "f":
                raise ValueError("actions are not a float array")
            if actions.ndim != 2 or actions.shape[1] != spec.action_dim:
                raise ValueError(
                    f"actions of shape {actions.shape}, expected (H, {spec.action_dim})"
                )
            if actions.shape[0] < spec.chunk_len:
                raise ValueError(f"{actions.shape[0]} actions, the spec needs {spec.chunk_len}")
            actions = actions[: spec.chunk_len]
            if not np.all(np.isfinite(actions)):
                raise ValueError("non-finite actions")
            mode = FULL_COMPUTE
            if self._ours:
                stamp = float(reply[op.STAMP_KEY])
                if not math.isclose(stamp, float(observation.stamp), abs_tol=1e-9):
                    raise ValueError(f"stamp {stamp} answers another observation")
                mode = mode_from_wire(reply[op.MODE_KEY])
            timing = reply.get("server_timing", {})
            server_ms = {k: float(v) for k, v in dict(timing).items() if isinstance(v, int | float)}
            served = sum(server_ms.values())
            timings = {"transport": max(self.last_round_trip_ms - served, 0.0)}
            return ActionChunk(
                actions=actions.astype(np.float32),  # a writable copy
                stamp=float(observation.stamp),
                mode=mode,
                timings_ms=timings,
                info={f"server_{k}": v for k, v in server_ms.items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteError(f"reply from {self.url} refused: {exc}") from None

    def _exchange(self, message: bytes) -> Any:
        try:
            self._ws.send(message)
            reply = self._ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            self._drop()
            raise RemoteUnavailable(
                f"no reply from {self.url} within {self.timeout_s:g} s; reconnecting on the "
                "next call"
            ) from None
        except (ConnectionClosed, OSError) as exc:
            self._drop()
            raise RemoteUnavailable(f"connection to {self.url} lost: {exc}") from None
        if isinstance(reply, str):
            return reply
        try:
            return packed.unpack(reply)
        except wire.WireError as exc:
            self._drop()
            raise RemoteError(f"malformed reply from {self.url}: {exc}") from None

    def _connect(self) -> None:
        self._drop()
        ssl_context = None
        if self.url.startswith("wss://"):
            ssl_context = ssl.create_default_context(cafile=self._tls_ca)
        try:
            ws = connect(
                self.url,
                compression=None,
                max_size=wire.MAX_MESSAGE_BYTES,
                additional_headers=self._headers,
                open_timeout=self.timeout_s,
                close_timeout=1.0,
                legacy=True,  # a long-lived connection, not a context manager
                ssl=ssl_context,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise RemoteRejected(f"{self.url} refused the API key (HTTP {status})") from None
            raise RemoteUnavailable(f"{self.url} refused the connection (HTTP {status})") from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise RemoteUnavailable(f"cannot connect to {self.url}: {exc}") from None
        try:
            raw = ws.recv(timeout=self.timeout_s)
            metadata = packed.unpack(raw) if isinstance(raw, bytes) else None
        except (TimeoutError, ConnectionClosed, wire.WireError) as exc:
            ws.close()
            raise RemoteUnavailable(f"no metadata from {self.url}: {exc}") from None
        if not isinstance(metadata, dict):
            ws.close()
            raise RemoteError(f"{self.url} sent no metadata map: not an openpi server")
        try:
            spec, identity, ours = self._identify(metadata)
            self.pinned_identity = pinned(self.pinned_identity, identity, self.url)
        except RemoteError:  # RemoteRejected too
            ws.close()
            raise
        self._ws, self._spec, self._ours, self.server_metadata = ws, spec, ours, metadata

    def _identify(self, metadata: dict) -> tuple[PolicySpec, str, bool]:
        ours = metadata.get(op.METADATA_KEY)
        if isinstance(ours, dict) and ours.get("protocol") == op.PROTOCOL:
            try:
                return PolicySpec.from_dict(ours["spec"]), spec_hash(ours["spec"]), True
            except Exception as exc:
                raise RemoteError(f"unreadable spec from {self.url}: {exc}") from None
        if self._fallback_spec is None:
            raise RemoteError(
                f"{self.url} is an openpi server that does not describe its policy: give the "
                "engine a spec (parameter checkpoint: a directory with its spec.json)"
            )
        if self._image_keys and len(self._image_keys) != len(self._fallback_spec.cameras):
            raise RemoteError(
                f"{len(self._image_keys)} openpi image keys for "
                f"{len(self._fallback_spec.cameras)} cameras"
            )
        identity = json.dumps(metadata, sort_keys=True, default=str)
        return self._fallback_spec, f"openpi:{spec_hash({'metadata': identity})}", False

    def _drop(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:  # already gone
                pass
            self._ws = None
