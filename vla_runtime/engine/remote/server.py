"""`PolicyServer`: a ROUTER socket serving one policy to many robots, one session per client
identity; `serve_main` is `vla-runtime serve`."""

from __future__ import annotations

import argparse
import copy
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.auth.thread import ThreadAuthenticator

from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import Observation, PolicyError
from vla_runtime.engine.remote import wire
from vla_runtime.engine.remote.keys import generate_keys, is_loopback, load_server_keys
from vla_runtime.engine.remote.protocol import (
    DEFAULT_BIND,
    MAX_MESSAGE_BYTES,
    error_reply,
    float_map,
    mode_from_wire,
    mode_to_wire,
    ok_reply,
    spec_mismatch,
)

log = logging.getLogger(__name__)


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
                reply = wire.encode(error_reply(None, "internal", f"server error: {exc!r}"))
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
            return wire.encode(error_reply(None, "bad_request", str(exc)))
        request_id = request.get("id")
        version = request.get("v")
        if version != wire.PROTOCOL_VERSION:
            return wire.encode(
                error_reply(
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
                    error_reply(
                        request_id, "handshake_required", "unknown session: say hello first"
                    )
                )
            session.last_seen = time.monotonic()
            session.requests += 1
            return wire.encode(self._infer(session, request))
        return wire.encode(error_reply(request_id, "bad_request", f"unknown op {op!r}"))

    def _hello(self, identity: bytes, request: dict) -> dict:
        expected = request.get("expected_spec")
        if expected is not None:
            mismatch = spec_mismatch(expected, self._spec_dict)
            if mismatch:
                return error_reply(
                    request.get("id"),
                    "spec",
                    f"policy spec mismatch (client expects vs server serves): {mismatch}",
                )
        if identity not in self._sessions:
            log.info("client %s connected (%d sessions)", identity.hex(), len(self._sessions) + 1)
        self._sessions[identity] = _Session(self._session_policy())
        return ok_reply(request.get("id"), spec=self._spec_dict)

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
            mode = mode_from_wire(request.get("mode", {}))
            observation = Observation(
                images=images,
                state=state,
                instruction=session.instruction,
                stamp=float(request.get("stamp", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            return error_reply(request_id, "bad_request", f"malformed infer request: {exc}")
        started = time.perf_counter()
        try:
            chunk = session.policy.infer(observation, mode, plan)
        except PolicyError as exc:
            return error_reply(request_id, "policy", str(exc))
        infer_ms = (time.perf_counter() - started) * 1e3
        return ok_reply(
            request_id,
            actions=np.asarray(chunk.actions, dtype=np.float32),
            stamp=float(chunk.stamp),
            mode=mode_to_wire(chunk.mode),
            timings_ms=float_map(chunk.timings_ms),
            info=float_map(chunk.info),
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
    sys.exit(serve_main(sys.argv[1:]))
