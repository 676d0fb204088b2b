"""`vla-runtime bench transport`: what serving a policy costs over running it in-process.

`overhead_ms.<path>`: round trip minus the server's own `infer` time, for one observation of
2 cameras × 224×224×3 uint8 + state, through each way a robot reaches a policy server: `zmq`
(our protocol, `PolicyServer` + `RemoteClient`; `zmq_curve` with `--curve`), `openpi` (openpi's
websocket protocol, `OpenpiServer` + the `openpi` back end) and `ray` (Ray Serve's HTTP ingress
and a replica, where the `fleet` extra is installed). Servers run `EchoPolicy` in a process of
their own (no GIL shared with the client), through exactly the framing, sockets and session
logic of a real policy. `throughput_rps.<robots>`: full-compute requests per second of 1, 4 and
8 concurrent robots against the shipped policy (torch, 1 thread per replica) on 2 Ray Serve
replicas, with `@serve.batch` (batched) and without (unbatched).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import platform
import sys
import tempfile

import zmq

from vla_runtime.bench import ray_transport
from vla_runtime.bench.echo import BENCH_SPEC, EchoPolicy, overhead_ms, percentiles
from vla_runtime.bench.progress import bench_bar, step
from vla_runtime.engine.remote import wire
from vla_runtime.engine.remote.client import RemoteClient
from vla_runtime.engine.remote.keys import (
    add_robot,
    generate_keys,
    load_client_keys,
    load_server_keys,
)
from vla_runtime.engine.remote.openpi_policy import OpenpiPolicy
from vla_runtime.engine.remote.openpi_server import OpenpiServer
from vla_runtime.engine.remote.server import PolicyServer

TARGETS_MS = {"zmq": 1.0, "openpi": 3.0, "ray": 12.0}  # overhead p99
BATCHING_TARGET = 2.0  # batched / unbatched throughput at 8 robots


def _serve_echo(protocol: str, keys: str | None, ready, stop) -> None:
    if protocol == "openpi":
        server = OpenpiServer(EchoPolicy(), port=0)
        ready.send(server.url)
        server.serve(stop)
        return
    secret, allowed = load_server_keys(keys) if keys else (None, None)
    server = PolicyServer(
        EchoPolicy(), "tcp://127.0.0.1:*", curve_secret=secret, authorized_clients=allowed
    )
    ready.send(server.endpoint)
    try:
        server.serve(stop)
    finally:
        server.close()


def _overhead(protocol: str, n: int, warmup: int, curve: bool = False) -> dict:
    """Overhead (ms) of `n` round trips after `warmup`, through a server in its own process."""
    with tempfile.TemporaryDirectory() as keys:
        server_public, client_keys = None, None
        if curve:
            generate_keys(keys)
            server_public, client_keys = load_client_keys(add_robot(keys, "bench"))
        ctx = mp.get_context("spawn")
        ready_recv, ready_send = ctx.Pipe(duplex=False)
        stop = ctx.Event()
        args = (protocol, keys if curve else None, ready_send, stop)
        server = ctx.Process(target=_serve_echo, args=args, daemon=True)
        server.start()
        try:
            if not ready_recv.poll(60):
                raise RuntimeError("bench server did not start within 60 s")
            address = ready_recv.recv()
            if protocol == "openpi":
                client = OpenpiPolicy(address, timeout_s=10.0)
            else:
                client = RemoteClient(address, server_public, client_keys, timeout_s=10.0)
            with client:
                samples = overhead_ms(client, n, warmup)
        finally:
            stop.set()
            server.join(timeout=10)
            if server.is_alive():
                server.kill()
    return percentiles(samples)


def run_bench(
    n: int = 2000,
    warmup: int = 200,
    curve: bool = False,
    fleet: bool = True,
    robots: tuple[int, ...] = (1, 4, 8),
    seconds: float = 10.0,
    progress: bool = True,
) -> dict:
    """`progress`: a bar on stderr over the paths and the throughput configurations."""
    paths = {"zmq": False, **({"zmq_curve": True} if curve else {}), "openpi": False}
    ray_installed = importlib.util.find_spec("ray") is not None
    with_ray = fleet and ray_installed
    # Ray: its overhead path, then unbatched and batched per robot count
    total = len(paths) + (1 + 2 * len(robots) if with_ray else 0)
    overhead = {}
    result = {"overhead_ms": overhead}
    with bench_bar("transport", total, progress, unit="run") as bar:
        for path, encrypted in paths.items():
            with step(bar, f"{path} overhead"):
                overhead[path] = _overhead(path.removesuffix("_curve"), n, warmup, encrypted)
        if with_ray:
            figures = ray_transport.fleet_figures(min(n, 500), robots, seconds, bar)
            overhead["ray"] = figures["overhead_ms"]
            result["throughput_rps"] = figures["throughput_rps"]
    met = {
        f"{path}_overhead_p99_le_{target:g}ms": overhead[path]["p99"] <= target
        for path, target in TARGETS_MS.items()
        if path in overhead
    }
    at8 = result.get("throughput_rps", {}).get("8")
    if at8:
        gain = at8["batched"] / max(at8["unbatched"], 1e-9)
        result["batching_gain_at_8"] = round(gain, 2)
        met[f"batching_ge_{BATCHING_TARGET:g}x_at_8"] = gain >= BATCHING_TARGET
    result["met"] = met
    payload = sum(c.height * c.width * 3 for c in BENCH_SPEC.cameras) + BENCH_SPEC.state_dim * 4
    result["settings"] = {
        "n": n,
        "warmup": warmup,
        "endpoint": "loopback",
        "ray": "measured" if "ray" in overhead else (
            "skipped" if ray_installed else "not installed (pip install 'vla_runtime[fleet]')"
        ),
        "cameras": [[c.name, c.height, c.width, 3] for c in BENCH_SPEC.cameras],
        "state_dim": BENCH_SPEC.state_dim,
        "reply_actions": [BENCH_SPEC.chunk_len, BENCH_SPEC.action_dim],
        "request_payload_bytes": payload,
        "protocol_version": wire.PROTOCOL_VERSION,
        "libzmq": zmq.zmq_version(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "excluded": "server-side policy.infer time (measured per request)",
    }  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vla-runtime bench transport")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--curve", action="store_true", help="also zmq encrypted with CURVE")
    parser.add_argument("--no-fleet", action="store_true", help="skip Ray Serve")
    parser.add_argument("--json", action="store_true", help="(output is always one JSON object)")
    args = parser.parse_args(argv)
    print(json.dumps(run_bench(n=args.n, curve=args.curve, fleet=not args.no_fleet)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
