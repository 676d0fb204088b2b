"""`vla-runtime serve`: one policy for many robots, over our ZeroMQ protocol (`server`) or
openpi's websocket protocol (`openpi_server`); CURVE key management for the former."""

from __future__ import annotations

import argparse
import logging
import signal
import ssl
import sys
import threading
from urllib.parse import urlsplit

import zmq

from vla_runtime.core.threads import resolve_threads
from vla_runtime.engine.factory import BACKENDS, load_policy
from vla_runtime.engine.policy import PolicyError
from vla_runtime.engine.remote import openpi_protocol
from vla_runtime.engine.remote.keys import (
    add_robot,
    generate_keys,
    is_loopback,
    is_loopback_host,
    load_api_keys,
    load_server_keys,
    revoke_robot,
)
from vla_runtime.engine.remote.openpi_server import OpenpiServer
from vla_runtime.engine.remote.protocol import DEFAULT_BIND
from vla_runtime.engine.remote.server import PolicyServer, ServerLimits

log = logging.getLogger("vla_runtime.serve")
PROTOCOLS = ("zmq", "openpi")
DEFAULT_BINDS = {"zmq": DEFAULT_BIND, "openpi": f"ws://127.0.0.1:{openpi_protocol.DEFAULT_PORT}"}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vla-runtime serve",
        description="Serve a policy to robots. zmq (default): our protocol, CURVE keys off "
        "loopback, only robots added with --add-robot are served. openpi: openpi's websocket "
        "protocol for openpi-client, TLS and API keys off loopback.",
    )
    parser.add_argument("--protocol", default="zmq", choices=PROTOCOLS)
    parser.add_argument("--backend", default="torch", choices=list(BACKENDS))
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (default: random)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=0, help="CPU threads for the back end (0: host default)"
    )
    parser.add_argument(
        "--bind",
        default=None,
        help=f"zmq: tcp://HOST:PORT ({DEFAULT_BINDS['zmq']}); openpi: ws://HOST:PORT "
        f"({DEFAULT_BINDS['openpi']})",
    )
    parser.add_argument("--max-sessions", type=int, default=ServerLimits.max_sessions)
    parser.add_argument("--session-idle-s", type=float, default=ServerLimits.session_idle_s)
    parser.add_argument("--max-queue", type=int, default=ServerLimits.max_queue)
    parser.add_argument(
        "--curve-keys", default=None, metavar="DIR", help="zmq: key directory made by --gen-keys"
    )
    parser.add_argument("--api-keys", metavar="FILE", help="openpi: `ROBOT KEY` lines")
    parser.add_argument("--tls-cert", metavar="PEM", help="openpi: serve wss:// with this chain")
    parser.add_argument("--tls-key", metavar="PEM", help="openpi: the certificate's private key")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--gen-keys",
        default=None,
        metavar="DIR",
        help="write the server's CURVE key pair and an empty allow-list, then exit",
    )
    keys.add_argument(
        "--add-robot",
        metavar="NAME",
        help="with --curve-keys: a key pair for robot NAME, allowed; then exit",
    )
    keys.add_argument(
        "--revoke-robot",
        metavar="NAME",
        help="with --curve-keys: remove robot NAME from the allow-list; then exit "
        "(a running server refuses it within a second)",
    )
    return parser


def _manage_keys(args) -> int | None:
    """--gen-keys / --add-robot / --revoke-robot; None when none was asked."""
    if args.gen_keys:
        directory = generate_keys(args.gen_keys)
        print(
            f"server keys written to {directory}; allow each robot with "
            f"`vla-runtime serve --curve-keys {directory} --add-robot NAME`"
        )
        return 0
    if not (args.add_robot or args.revoke_robot):
        return None
    if not args.curve_keys:
        raise ValueError("--add-robot and --revoke-robot need --curve-keys DIR")
    if args.add_robot:
        bundle = add_robot(args.curve_keys, args.add_robot)
        print(
            f"robot {args.add_robot} allowed; copy {bundle} onto it and set the engine "
            f"parameter curve_keys to that directory"
        )
    elif revoke_robot(args.curve_keys, args.revoke_robot):
        print(f"robot {args.revoke_robot} revoked")
    else:
        raise ValueError(f"robot {args.revoke_robot!r} has no key in {args.curve_keys}")
    return 0


def _limits(args) -> ServerLimits:
    limits = ServerLimits(args.max_sessions, args.session_idle_s, args.max_queue)
    if min(limits.max_sessions, limits.max_queue) < 1 or limits.session_idle_s <= 0:
        raise ValueError("--max-sessions, --max-queue and --session-idle-s must be positive")
    return limits


def _openpi_address(bind: str, tls: bool) -> tuple[str, int]:
    parts = urlsplit(bind)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"--bind for openpi is ws://HOST:PORT, got {bind!r}")
    if (parts.scheme == "wss") != tls:
        raise ValueError("wss:// needs --tls-cert and --tls-key, and they need wss://")
    return parts.hostname, parts.port or openpi_protocol.DEFAULT_PORT


def _check_security(args, bind: str) -> None:
    """Refuse an open server before the (slow) model load; the servers check again."""
    if args.protocol == "zmq":
        if not args.curve_keys and not is_loopback(bind):
            raise ValueError(
                f"refusing to serve on {bind} without --curve-keys: anything but loopback "
                "needs CURVE authentication (create keys with --gen-keys DIR)"
            )
        if args.api_keys or args.tls_cert or args.tls_key:
            raise ValueError("--api-keys and --tls-* are for --protocol openpi")
        return
    if args.curve_keys:
        raise ValueError("--curve-keys is for --protocol zmq; openpi uses --api-keys")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    host, _ = _openpi_address(bind, bool(args.tls_cert))
    if not is_loopback_host(host) and not (args.tls_cert and args.api_keys):
        raise ValueError(
            f"refusing to serve openpi on {host} without --tls-cert/--tls-key and --api-keys: "
            "anything but loopback needs TLS and authentication"
        )


def _start(args, bind: str, policy, limits: ServerLimits, threads: int):
    if args.protocol == "zmq":
        secret, allowed = load_server_keys(args.curve_keys) if args.curve_keys else (None, None)
        return PolicyServer(
            policy, bind, curve_secret=secret, authorized_clients=allowed, seed=args.seed,
            limits=limits, threads=threads,
        )  # fmt: skip
    tls = None
    if args.tls_cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    host, port = _openpi_address(bind, tls is not None)
    api_keys = load_api_keys(args.api_keys) if args.api_keys else None
    return OpenpiServer(
        policy, host, port, seed=args.seed, limits=limits, api_keys=api_keys, tls=tls,
        threads=threads,
    )  # fmt: skip


def serve_main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[serve] %(levelname)s %(message)s")
    bind = args.bind or DEFAULT_BINDS[args.protocol]
    try:
        managed = _manage_keys(args)
        if managed is not None:
            return managed
        limits = _limits(args)
        _check_security(args, bind)
        threads = resolve_threads(args.threads)
        policy = load_policy(
            backend=args.backend, checkpoint=args.checkpoint, preset=args.preset,
            device=args.device, seed=args.seed, threads=threads,
        )  # fmt: skip
        server = _start(args, bind, policy, limits, threads)
    except (ValueError, OSError, ImportError, PolicyError, zmq.ZMQError) as exc:
        log.error("%s", exc)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    spec = policy.spec
    where = server.endpoint if args.protocol == "zmq" else server.url
    secure = getattr(server, "secure", False) or where.startswith("wss")
    log.info(
        "serving %s policy over %s (%d cameras, H=%d, action_dim=%d, spec %s, %s threads) on "
        "%s%s",
        args.backend, args.protocol, len(spec.cameras), spec.chunk_len, spec.action_dim,
        server.spec_hash, threads, where, " (authenticated, encrypted)" if secure else "",
    )  # fmt: skip
    try:
        server.serve(stop)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
