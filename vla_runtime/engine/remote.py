"""Remote back end (`vla-runtime serve`): one policy served to many robots over ZeroMQ.

`PolicyServer` owns a ROUTER socket; each robot is a `RemoteClient` (a DEALER socket that
implements the `Policy` protocol). Messages use `wire` framing: a msgpack header plus one raw
frame per array, so camera images are never copied into msgpack.

Protocol (every header carries `v` = PROTOCOL_VERSION and a request `id`):
  hello  {expected_spec?}                     -> {spec}      version and spec are checked here
  infer  {images, state, instruction?, stamp, mode, plan?} -> {actions, stamp, mode, ...}
The server keeps a session per client identity (ROUTER routing id): infer is refused until the
client said hello, so a version or spec mismatch can never slip through; the instruction is
cached per session (sent only when it changes); and each session gets its own policy state
(KV caches, previous chunk for warm starts, noise RNG), so one robot's cached camera KV or
previous chunk never leaks into another robot's inference (see `PolicyServer`). A restarted
server has no sessions; clients notice (`handshake_required`) and say hello again.

Security: CURVE (encryption + server authentication, optional client allow-list) is mandatory
whenever the server binds anything but loopback/ipc: the server refuses to start without keys.
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import itertools
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from vla_runtime.engine import wire
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import (
    FULL_COMPUTE,
    ActionChunk,
    ComputeMode,
    Observation,
    PolicyError,
    PolicySpec,
)

log = logging.getLogger(__name__)

DEFAULT_BIND = "tcp://127.0.0.1:5555"
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
# Largest message a server accepts: bounds the memory a misbehaving peer can make us allocate.
MAX_MESSAGE_BYTES = 256 << 20
SERVER_KEY_NAME = "server"
CLIENT_KEY_NAME = "client"
AUTHORIZED_CLIENTS_DIR = "authorized_clients"


class RemoteError(RuntimeError):
    """Base class of remote back-end failures."""


class RemoteUnavailable(RemoteError):
    """No answer in time: the server is down, overloaded, or (CURVE) the keys do not match."""


class RemoteRejected(RemoteError):
    """The server refused the session: protocol version or policy spec mismatch."""


def is_loopback(endpoint: str) -> bool:
    """True when `endpoint` can only be reached from this host (loopback tcp, ipc, inproc)."""
    transport, _, address = endpoint.partition("://")
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp":
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', interface names, host names: may be reachable from outside
        return False


# ---------------------------------------------------------------------------------------------
# Keys


def generate_keys(directory: str | Path) -> Path:
    """Write a server and a client CURVE key pair under `directory` and authorise the client.

    Give robots `server.key` (public) and `client.key_secret`; keep `server.key_secret` on the
    server. More robots: drop their public `*.key` files into `authorized_clients/`."""
    import shutil

    import zmq.auth

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(directory, SERVER_KEY_NAME)
    client_public, _ = zmq.auth.create_certificates(directory, CLIENT_KEY_NAME)
    allowed = directory / AUTHORIZED_CLIENTS_DIR
    allowed.mkdir(exist_ok=True)
    shutil.copy(client_public, allowed / Path(client_public).name)
    for secret in directory.glob("*.key_secret"):
        secret.chmod(0o600)
    return directory


def load_server_keys(directory: str | Path) -> tuple[bytes, Path | None]:
    """(server secret key, allow-list directory or None) from a `generate_keys` directory."""
    import zmq.auth

    directory = Path(directory)
    path = directory / f"{SERVER_KEY_NAME}.key_secret"
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: create keys with `vla-runtime serve --gen-keys DIR`")
    _, secret = zmq.auth.load_certificate(path)
    allowed = directory / AUTHORIZED_CLIENTS_DIR
    return secret, (allowed if allowed.is_dir() and any(allowed.glob("*.key")) else None)


def load_client_keys(directory: str | Path) -> tuple[bytes, tuple[bytes, bytes]]:
    """(server public key, (client public, client secret)) from a `generate_keys` directory."""
    import zmq.auth

    directory = Path(directory)
    server_public, _ = zmq.auth.load_certificate(directory / f"{SERVER_KEY_NAME}.key")
    client_public, client_secret = zmq.auth.load_certificate(
        directory / f"{CLIENT_KEY_NAME}.key_secret"
    )
    return server_public, (client_public, client_secret)


# ---------------------------------------------------------------------------------------------
# Server


@dataclass
class _Session:
    policy: Any
    instruction: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    requests: int = 0


class PolicyServer:
    """Serve `policy` on `bind`. Use `serve(stop_event)` in the foreground or `start()`/`stop()`.

    Requests are handled one at a time, in arrival order (one accelerator, one model).
    Per-client state: a policy with `reset()` (the caching back ends) is shallow-copied for each
    client session and the copy reset (and `reseed(seed)`): weights and runtime sessions are
    shared, caches and RNG are not. Other policies are shared as they are (stateless)."""

    def __init__(
        self,
        policy,
        bind: str = DEFAULT_BIND,
        curve_secret: bytes | str | None = None,
        authorized_clients: str | Path | None = None,
        session_ttl_s: float = 600.0,
        seed: int = 0,
    ):
        if curve_secret is None and not is_loopback(bind):
            raise ValueError(
                f"refusing to serve on {bind} without CURVE keys: anything but loopback needs "
                "authentication (create keys with `vla-runtime serve --gen-keys DIR`, then pass "
                "`--curve-keys DIR`), or bind tcp://127.0.0.1:PORT"
            )
        self.policy = policy
        self._seed = seed
        self._spec_dict = policy.spec.to_dict()
        self._session_ttl_s = session_ttl_s
        self._sessions: dict[bytes, _Session] = {}
        self._last_sweep = time.monotonic()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._auth = None
        self._socket = self._ctx.socket(zmq.ROUTER)
        self._socket.linger = 0
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
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
        from zmq.auth.thread import ThreadAuthenticator

        secret = secret.encode() if isinstance(secret, str) else secret
        self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger(f"{__name__}.auth"))
        self._auth.start()
        if authorized_clients is None:
            # Any client that knows our public key may connect (still encrypted, and the
            # client authenticates us); an allow-list additionally authenticates clients.
            self._auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        else:
            self._auth.configure_curve(domain="*", location=str(authorized_clients))
        self._socket.curve_secretkey = secret
        self._socket.curve_publickey = zmq.curve_public(secret)
        self._socket.curve_server = True

    # -- loop ------------------------------------------------------------------------------

    def serve(self, stop: threading.Event | None = None, poll_ms: int = 100) -> None:
        stop = stop or self._stop
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not stop.is_set():
            if not poller.poll(poll_ms):
                continue
            frames = self._socket.recv_multipart(copy=False)
            identity = frames[0].bytes
            try:
                reply = self.handle(identity, frames[1:])
            except Exception as exc:  # never let one bad request take the server down
                log.exception("request from %s failed", identity.hex())
                reply = wire.encode(_error(None, "internal", f"server error: {exc!r}"))
            try:
                self._socket.send_multipart([identity, *reply], copy=False)
            except zmq.ZMQError as exc:
                log.warning("reply to %s dropped: %s", identity.hex(), exc)

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

    def handle(self, identity: bytes, frames: list[Any]) -> list[Any]:
        """One request (frames after the routing id) -> reply frames."""
        try:
            request = wire.decode(frames)
        except wire.WireError as exc:
            log.warning("malformed request from %s: %s", identity.hex(), exc)
            return wire.encode(_error(None, "bad_request", str(exc)))
        request_id = request.get("id")
        version = request.get("v")
        if version != wire.PROTOCOL_VERSION:
            return wire.encode(
                _error(
                    request_id,
                    "version",
                    f"protocol version mismatch: client speaks v{version}, server speaks "
                    f"v{wire.PROTOCOL_VERSION}; install the same vla_runtime on both ends",
                )
            )
        self._sweep_sessions()
        op = request.get("op")
        if op == "hello":
            return wire.encode(self._hello(identity, request))
        if op == "infer":
            session = self._sessions.get(identity)
            if session is None:
                return wire.encode(
                    _error(request_id, "handshake_required", "unknown session: say hello first")
                )
            session.last_seen = time.monotonic()
            session.requests += 1
            return wire.encode(self._infer(session, request))
        return wire.encode(_error(request_id, "bad_request", f"unknown op {op!r}"))

    def _hello(self, identity: bytes, request: dict) -> dict:
        expected = request.get("expected_spec")
        if expected is not None:
            mismatch = _spec_mismatch(expected, self._spec_dict)
            if mismatch:
                return _error(
                    request.get("id"),
                    "spec",
                    f"policy spec mismatch (client expects vs server serves): {mismatch}",
                )
        if identity not in self._sessions:
            log.info("client %s connected (%d sessions)", identity.hex(), len(self._sessions) + 1)
        self._sessions[identity] = _Session(self._session_policy())
        return _ok(request.get("id"), spec=self._spec_dict)

    def _session_policy(self):
        if not callable(getattr(self.policy, "reset", None)):
            return self.policy
        policy = copy.copy(self.policy)
        policy.reset()
        if callable(getattr(policy, "reseed", None)):
            policy.reseed(self._seed)
        return policy

    def _infer(self, session: _Session, request: dict) -> dict:
        request_id = request.get("id")
        try:
            if "instruction" in request:
                session.instruction = str(request["instruction"])
            images = request["images"]
            if not isinstance(images, dict) or not all(
                isinstance(v, np.ndarray) for v in images.values()
            ):
                raise PolicyError("images must map camera names to arrays")
            state = request["state"]
            if not isinstance(state, np.ndarray):
                raise PolicyError("state must be an array")
            plan = request.get("plan")
            if plan is not None and not isinstance(plan, np.ndarray):
                raise PolicyError("plan must be an array or absent")
            mode = _mode_from(request.get("mode", {}))
            observation = Observation(
                images=images,
                state=state,
                instruction=session.instruction,
                stamp=float(request.get("stamp", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            return _error(request_id, "bad_request", f"malformed infer request: {exc}")
        started = time.perf_counter()
        try:
            chunk = session.policy.infer(observation, mode, plan)
        except PolicyError as exc:
            return _error(request_id, "policy", str(exc))
        infer_ms = (time.perf_counter() - started) * 1e3
        return _ok(
            request_id,
            actions=np.asarray(chunk.actions, dtype=np.float32),
            stamp=float(chunk.stamp),
            mode=_mode_to(chunk.mode),
            timings_ms=_float_map(chunk.timings_ms),
            info=_float_map(chunk.info),
            infer_ms=infer_ms,
        )

    def _sweep_sessions(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < 10.0:
            return
        self._last_sweep = now
        for identity in [
            i for i, s in self._sessions.items() if now - s.last_seen > self._session_ttl_s
        ]:
            del self._sessions[identity]


def _ok(request_id, **body) -> dict:
    return {"v": wire.PROTOCOL_VERSION, "id": request_id, "ok": True, **body}


def _error(request_id, kind: str, message: str) -> dict:
    return {
        "v": wire.PROTOCOL_VERSION,
        "id": request_id,
        "ok": False,
        "kind": kind,
        "error": message,
    }


def _mode_to(mode: ComputeMode) -> dict:
    stable = None if mode.stable_cameras is None else sorted(mode.stable_cameras)
    return {
        "vision_level": mode.vision_level,
        "denoise_level": mode.denoise_level,
        "stable_cameras": stable,
    }


def _mode_from(raw: Any) -> ComputeMode:
    if not isinstance(raw, dict):
        raise TypeError(f"compute mode must be a map, got {type(raw).__name__}")
    stable = raw.get("stable_cameras")
    return ComputeMode(
        raw.get("vision_level", 0),
        raw.get("denoise_level", 0),
        None if stable is None else frozenset(str(name) for name in stable),
    )


def _float_map(values: dict) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            continue  # diagnostics only; never fail a chunk over an odd info value
    return out


def _spec_mismatch(expected: Any, served: dict) -> str:
    """Human-readable list of differing fields ('' when equal)."""
    if not isinstance(expected, dict):
        return f"expected spec must be a map, got {type(expected).__name__}"
    try:
        expected = PolicySpec.from_dict(expected).to_dict()
    except Exception as exc:
        return f"unreadable expected spec: {exc}"
    diffs = [
        f"{key}: {expected.get(key)!r} vs {served.get(key)!r}"
        for key in sorted(set(expected) | set(served))
        if _normalise(expected.get(key)) != _normalise(served.get(key))
    ]
    return "; ".join(diffs)


def _normalise(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# Client


class RemoteClient:
    """A `Policy` whose infer() runs on a `PolicyServer`.

    Every request waits at most `timeout_s`; on a timeout the DEALER socket is closed and the
    next call opens a new one (and says hello again), so a restarted server is picked up
    without recreating the client. `spec` comes from the server's handshake; pass
    `expected_spec` to have the server refuse a different policy."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        server_public_key: bytes | str | None = None,
        client_keys: tuple[bytes, bytes] | None = None,
        timeout_s: float = 2.0,
        expected_spec: PolicySpec | None = None,
        connect: bool = True,
    ):
        self.endpoint = endpoint
        self.timeout_s = float(timeout_s)
        self._server_key = (
            server_public_key.encode() if isinstance(server_public_key, str) else server_public_key
        )
        if self._server_key is not None and client_keys is None:
            client_keys = zmq.curve_keypair()  # the server may allow any client key
        self._client_keys = client_keys
        self.expected_spec = expected_spec
        self._ctx = zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        self._session_open = False
        self._sent_instruction: str | None = None
        self._spec: PolicySpec | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.last_round_trip_ms = float("nan")
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
                if kind in ("version", "spec"):
                    self._session_open = False
                    raise RemoteRejected(message)
                raise RemoteError(f"remote server error ({kind}): {message}")
            self._sent_instruction = observation.instruction
            return self._chunk_from(reply)

    def close(self) -> None:
        with self._lock:
            self._drop_socket()

    def __enter__(self) -> RemoteClient:
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
            "mode": _mode_to(mode),
        }
        if observation.instruction != self._sent_instruction:
            request["instruction"] = observation.instruction
        if plan is not None:
            request["plan"] = np.asarray(plan)
        return request

    def _chunk_from(self, reply: dict) -> ActionChunk:
        try:
            timings = dict(reply.get("timings_ms", {}))
            infer_ms = float(reply.get("infer_ms", 0.0))
            timings["transport"] = max(self.last_round_trip_ms - infer_ms, 0.0)
            info = dict(reply.get("info", {}))
            info["server_infer_ms"] = infer_ms
            # Copy out of the frame so the caller owns a writable array.
            actions = np.array(reply["actions"], dtype=np.float32)
            return ActionChunk(
                actions=actions,
                stamp=float(reply["stamp"]),
                mode=_mode_from(reply["mode"]),
                timings_ms=timings,
                info=info,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteError(f"malformed reply from {self.endpoint}: {exc}") from exc

    def _hello(self) -> None:
        self._session_open = False
        self._sent_instruction = None
        request: dict[str, Any] = {"op": "hello"}
        if self.expected_spec is not None:
            request["expected_spec"] = self.expected_spec.to_dict()
        reply = self._request(request)
        if not reply["ok"]:
            raise RemoteRejected(f"{self.endpoint} refused the session: {reply.get('error')}")
        try:
            self._spec = PolicySpec.from_dict(reply["spec"])
        except Exception as exc:
            raise RemoteError(f"unreadable spec from {self.endpoint}: {exc}") from exc
        self._session_open = True

    def _request(self, body: dict) -> dict:
        socket = self._ensure_socket()
        request_id = next(self._ids)
        frames = wire.encode({"v": wire.PROTOCOL_VERSION, "id": request_id, **body})
        started = time.perf_counter()
        try:
            socket.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._drop_socket()
            raise RemoteUnavailable(f"cannot send to {self.endpoint}: queue full") from None
        deadline = started + self.timeout_s
        while True:
            remaining_ms = int((deadline - time.perf_counter()) * 1e3)
            if remaining_ms <= 0 or not socket.poll(remaining_ms, zmq.POLLIN):
                self._drop_socket()
                raise RemoteUnavailable(
                    f"no reply from {self.endpoint} within {self.timeout_s:g} s (server down, "
                    "overloaded, or CURVE keys not accepted); reconnecting on the next call"
                )
            try:
                reply = wire.decode(socket.recv_multipart(copy=False))
            except wire.WireError as exc:
                raise RemoteError(f"malformed reply from {self.endpoint}: {exc}") from exc
            if reply.get("v") != wire.PROTOCOL_VERSION:
                self._drop_socket()
                raise RemoteRejected(
                    f"protocol version mismatch: server speaks v{reply.get('v')}, client "
                    f"speaks v{wire.PROTOCOL_VERSION}; install the same vla_runtime on both ends"
                )
            if reply.get("id") in (request_id, None):
                self.last_round_trip_ms = (time.perf_counter() - started) * 1e3
                return reply
            # A late reply to an earlier request: skip it and keep waiting for ours.

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

    def _drop_socket(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        self._session_open = False


# ---------------------------------------------------------------------------------------------
# CLI


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vla-runtime serve", description="Serve a policy to robots over ZeroMQ."
    )
    parser.add_argument("--backend", default="torch", choices=["torch", "onnxruntime", "tensorrt"])
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (default: random)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=0, help="CPU threads for the back end (0: host default)"
    )
    parser.add_argument("--bind", default=DEFAULT_BIND)
    parser.add_argument("--curve-keys", default=None, help="directory made by --gen-keys")
    parser.add_argument(
        "--gen-keys", default=None, metavar="DIR", help="write server/client CURVE keys and exit"
    )
    return parser


def serve_main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[serve] %(levelname)s %(message)s")
    if args.gen_keys:
        directory = generate_keys(args.gen_keys)
        print(
            f"keys written to {directory}: keep server.key_secret on the server; give robots "
            "server.key and client.key_secret (or add their own *.key to authorized_clients/)"
        )
        return 0
    secret, allowed = None, None
    try:
        if not args.curve_keys and not is_loopback(args.bind):
            # Same check as PolicyServer, done before the (slow) model load.
            raise ValueError(
                f"refusing to serve on {args.bind} without --curve-keys: anything but loopback "
                "needs CURVE authentication (create keys with --gen-keys DIR)"
            )
        if args.curve_keys:
            secret, allowed = load_server_keys(args.curve_keys)
        policy = _load_backend(args)
        server = PolicyServer(
            policy, args.bind, curve_secret=secret, authorized_clients=allowed, seed=args.seed
        )
    except (ValueError, FileNotFoundError, ImportError, zmq.ZMQError) as exc:
        log.error("%s", exc)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    spec = policy.spec
    log.info(
        "serving %s policy (%d cameras, H=%d, action_dim=%d) on %s%s",
        args.backend,
        len(spec.cameras),
        spec.chunk_len,
        spec.action_dim,
        server.endpoint,
        " with CURVE" if server.secure else "",
    )
    try:
        server.serve(stop)
    finally:
        server.close()
    return 0


def _load_backend(args):
    return load_policy(
        backend=args.backend,
        checkpoint=args.checkpoint,
        preset=args.preset,
        device=args.device,
        seed=args.seed,
        threads=args.threads,
    )


if __name__ == "__main__":
    import sys

    sys.exit(serve_main(sys.argv[1:]))
