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

from vla_runtime.core.help_text import CommandParser
from vla_runtime.core.threads import resolve_threads
from vla_runtime.engine.factory import BACKENDS, load_policy
from vla_runtime.engine.policy import PolicyError
from vla_runtime.engine.remote import openpi_protocol, ray_serve
from vla_runtime.engine.remote.keys import (
    add_robot,
    check_exposure,
    generate_keys,
    is_loopback,
    load_api_keys,
    load_server_keys,
    revoke_robot,
)
from vla_runtime.engine.remote.openpi_server import OpenpiServer
from vla_runtime.engine.remote.protocol import DEFAULT_BIND
from vla_runtime.engine.remote.server import PolicyServer
from vla_runtime.engine.remote.sessions import ServerLimits
from vla_runtime.engine.remote.wire import first_line

log = logging.getLogger("vla_runtime.serve")
PROTOCOLS = ("zmq", "openpi")
SCHEMES = {"openpi": ("ws", "wss"), "ray": ("http", "https")}
DEFAULT_BINDS = {
    "zmq": DEFAULT_BIND,
    "openpi": f"ws://127.0.0.1:{openpi_protocol.DEFAULT_PORT}",
    "ray": "http://127.0.0.1:8000",
}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="vla-runtime serve",
        description="Serve a policy to robots. zmq (default): our protocol, CURVE keys off "
        "loopback, only robots added with --add-robot are served. openpi: openpi's websocket "
        "protocol for openpi-client, TLS and API keys off loopback. --engine ray: replicas "
        "behind Ray Serve's HTTP ingress (pip install 'vla_runtime[fleet]'), TLS and API keys "
        "off loopback.",
    )
    parser.add_argument("--protocol", default="zmq", choices=PROTOCOLS)
    parser.add_argument(
        "--engine",
        default="local",
        choices=("local", "ray"),
        help="local: this process serves; ray: a Ray Serve deployment (robots: backend ray)",
    )
    fleet = parser.add_argument_group("--engine ray")
    fleet.add_argument("--replicas", type=int, default=2)
    fleet.add_argument("--max-batch-size", type=int, default=8, help="1: no batching")
    fleet.add_argument("--batch-wait-timeout-s", type=float, default=0.005)
    fleet.add_argument("--ray-address", help="join this Ray cluster (default: a local one)")
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
        f"({DEFAULT_BINDS['openpi']}); ray: http://HOST:PORT ({DEFAULT_BINDS['ray']})",
    )
    parser.add_argument("--max-sessions", type=int, default=ServerLimits.max_sessions)
    parser.add_argument("--session-idle-s", type=float, default=ServerLimits.session_idle_s)
    parser.add_argument("--max-queue", type=int, default=ServerLimits.max_queue)
    parser.add_argument(
        "--curve-keys", default=None, metavar="DIR", help="zmq: key directory made by --gen-keys"
    )
    parser.add_argument("--api-keys", metavar="FILE", help="openpi, ray: `ROBOT KEY` lines")
    parser.add_argument("--tls-cert", metavar="PEM", help="openpi, ray: certificate chain")
    parser.add_argument("--tls-key", metavar="PEM", help="openpi, ray: its private key")
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


def _address(bind: str, schemes: tuple[str, str], tls: bool) -> tuple[str, int]:
    """(host, port) of `bind` for a websocket (ws, wss) or HTTP (http, https) server."""
    parts = urlsplit(bind)
    plain, secure = schemes
    if parts.scheme not in schemes or not parts.hostname or parts.port is None:
        raise ValueError(f"--bind is {plain}://HOST:PORT here, got {bind!r}")
    if (parts.scheme == secure) != tls:
        raise ValueError(f"{secure}:// needs --tls-cert and --tls-key, and they need {secure}://")
    return parts.hostname, parts.port


def _kind(args) -> str:
    if args.engine == "ray":
        if args.protocol != "zmq":
            raise ValueError("--engine ray speaks its own HTTP protocol: leave out --protocol")
        return "ray"
    return args.protocol


def _check_security(args, kind: str, bind: str) -> None:
    """Refuse an open server before the (slow) model load; the servers check again."""
    if kind == "zmq":
        if not args.curve_keys and not is_loopback(bind):
            raise ValueError(
                f"refusing to serve on {bind} without --curve-keys: anything but loopback "
                "needs CURVE authentication (create keys with --gen-keys DIR)"
            )
        if args.api_keys or args.tls_cert or args.tls_key:
            raise ValueError("--api-keys and --tls-* are for --protocol openpi and --engine ray")
        return
    if args.curve_keys:
        raise ValueError("--curve-keys is for the zmq protocol; use --api-keys")
    check_exposure(
        _address(bind, SCHEMES[kind], bool(args.tls_cert))[0],
        args.tls_cert, args.tls_key, args.api_keys,
    )  # fmt: skip


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
    host, port = _address(bind, SCHEMES["openpi"], tls is not None)
    if args.api_keys:
        load_api_keys(args.api_keys)  # a malformed file stops the start, not every request
    return OpenpiServer(
        policy, host, port, seed=args.seed, limits=limits, api_keys=args.api_keys, tls=tls,
        threads=threads,
    )  # fmt: skip


def serve_main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[serve] %(levelname)s %(message)s")
    try:
        managed = _manage_keys(args)
        if managed is not None:
            return managed
        kind = _kind(args)
        bind = args.bind or DEFAULT_BINDS[kind]
        limits = _limits(args)
        _check_security(args, kind, bind)
        threads = resolve_threads(args.threads)
        if kind == "ray":
            return _serve_ray(args, bind, limits, threads)
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
    where = server.endpoint if kind == "zmq" else server.url
    secure = getattr(server, "secure", False) or where.startswith("wss")
    log.info(
        "serving %s policy over %s (%d cameras, H=%d, action_dim=%d, spec %s, %s threads) on "
        "%s%s",
        args.backend, kind, len(spec.cameras), spec.chunk_len, spec.action_dim,
        server.spec_hash, threads, where, " (authenticated, encrypted)" if secure else "",
    )  # fmt: skip
    try:
        server.serve(stop)
    finally:
        server.stop()
    return 0


def _serve_ray(args, bind: str, limits: ServerLimits, threads: int) -> int:
    """Deploy on Ray Serve, serve until SIGINT / SIGTERM, then take the deployment down."""
    host, port = _address(bind, SCHEMES["ray"], bool(args.tls_cert))
    if min(args.replicas, args.max_batch_size) < 1 or args.batch_wait_timeout_s < 0:
        raise ValueError("--replicas and --max-batch-size >= 1, --batch-wait-timeout-s >= 0")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        url = ray_serve.deploy(
            checkpoint=args.checkpoint, preset=args.preset, backend=args.backend,
            device=args.device, seed=args.seed, threads=threads, replicas=args.replicas,
            max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.batch_wait_timeout_s,
            host=host, port=port, tokens_file=args.api_keys, tls_cert=args.tls_cert,
            tls_key=args.tls_key, limits=limits, ray_address=args.ray_address,
        )  # fmt: skip
    except ImportError:
        raise
    except Exception as exc:  # Ray's own failures (cluster, deployment): one line
        log.error("Ray Serve deployment failed: %s", first_line(exc))
        return 1
    log.info("serving %s policy on %s (Ray Serve, %d replicas)", args.backend, url, args.replicas)
    try:
        stop.wait()
    finally:
        ray_serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
