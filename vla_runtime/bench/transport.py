"""`vla-runtime bench transport`: remote back-end round-trip overhead, inference excluded.

A `PolicyServer` runs in its own process (no GIL sharing with the client) and serves
`EchoPolicy`, which returns a preallocated chunk, through exactly the same framing, sockets and
session logic as a real policy. The server also reports how long `infer` took; that time is
subtracted from every round trip, so the figures are pure transport + (de)serialisation cost
for one observation of 2 cameras × 224×224×3 uint8 + state.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import sys
import tempfile
import time

import numpy as np
import zmq

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode
from vla_runtime.engine.policy import ActionChunk, CameraSpec, Observation, PolicySpec
from vla_runtime.engine.remote import wire
from vla_runtime.engine.remote.client import RemoteClient
from vla_runtime.engine.remote.keys import (
    add_robot,
    generate_keys,
    load_client_keys,
    load_server_keys,
)
from vla_runtime.engine.remote.server import PolicyServer

BENCH_SPEC = PolicySpec(
    cameras=(CameraSpec("scene", 224, 224), CameraSpec("wrist", 224, 224)),
    state_dim=8,
    action_dim=8,
    chunk_len=50,
    dt=0.02,
)


class EchoPolicy:
    """Zero-cost policy for transport measurements: a fixed chunk stamped like the input."""

    def __init__(self, spec: PolicySpec = BENCH_SPEC):
        self.spec = spec
        self._actions = np.zeros((spec.chunk_len, spec.action_dim), dtype=np.float32)

    def infer(
        self,
        observation: Observation,
        compute_mode: ComputeMode = FULL_COMPUTE,
        plan=None,
        noise_scale=None,
    ) -> ActionChunk:
        return ActionChunk(self._actions, observation.stamp, compute_mode)


def _serve_echo(bind: str, keys: str | None, ready, stop) -> None:
    secret, allowed = load_server_keys(keys) if keys else (None, None)
    server = PolicyServer(EchoPolicy(), bind, curve_secret=secret, authorized_clients=allowed)
    ready.send(server.endpoint)
    try:
        server.serve(stop)
    finally:
        server.close()


def run_bench(n: int = 2000, warmup: int = 200, curve: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as keys:
        server_public, client_keys = None, None
        if curve:
            generate_keys(keys)
            server_public, client_keys = load_client_keys(add_robot(keys, "bench"))
        return _run(n, warmup, curve, keys if curve else None, server_public, client_keys)


def _run(n, warmup, curve, keys, server_public, client_keys) -> dict:
    ctx = mp.get_context("spawn")
    ready_recv, ready_send = ctx.Pipe(duplex=False)
    stop = ctx.Event()
    server = ctx.Process(
        target=_serve_echo, args=("tcp://127.0.0.1:*", keys, ready_send, stop), daemon=True
    )
    server.start()
    try:
        if not ready_recv.poll(60):
            raise RuntimeError("bench server did not start within 60 s")
        endpoint = ready_recv.recv()
        rng = np.random.default_rng(0)
        observation = Observation(
            images={
                cam.name: rng.integers(0, 256, (cam.height, cam.width, 3), dtype=np.uint8)
                for cam in BENCH_SPEC.cameras
            },
            state=rng.normal(size=BENCH_SPEC.state_dim).astype(np.float32),
            instruction="pick up the red cube",
        )
        overhead_us = np.empty(n)
        round_trip_us = np.empty(n)
        with RemoteClient(endpoint, server_public, client_keys, timeout_s=10.0) as client:
            for i in range(warmup + n):
                observation.stamp = float(i)
                started = time.perf_counter()
                chunk = client.infer(observation)
                elapsed_us = (time.perf_counter() - started) * 1e6
                if chunk.stamp != observation.stamp:
                    raise RuntimeError("reply does not belong to the request")
                if i >= warmup:
                    round_trip_us[i - warmup] = elapsed_us
                    overhead_us[i - warmup] = elapsed_us - chunk.info["server_infer_ms"] * 1e3
    finally:
        stop.set()
        server.join(timeout=10)
        if server.is_alive():
            server.kill()
    payload_bytes = sum(image.nbytes for image in observation.images.values())
    payload_bytes += observation.state.nbytes
    return {
        "p50_us": round(float(np.percentile(overhead_us, 50)), 1),
        "p99_us": round(float(np.percentile(overhead_us, 99)), 1),
        "max_us": round(float(overhead_us.max()), 1),
        "mean_us": round(float(overhead_us.mean()), 1),
        "round_trip_p50_us": round(float(np.percentile(round_trip_us, 50)), 1),
        "round_trip_p99_us": round(float(np.percentile(round_trip_us, 99)), 1),
        "target_p99_us": 1000.0,
        "settings": {
            "n": n,
            "warmup": warmup,
            "endpoint": "tcp loopback",
            "curve": curve,
            "cameras": [[c.name, c.height, c.width, 3] for c in BENCH_SPEC.cameras],
            "state_dim": BENCH_SPEC.state_dim,
            "reply_actions": [BENCH_SPEC.chunk_len, BENCH_SPEC.action_dim],
            "request_payload_bytes": payload_bytes,
            "protocol_version": wire.PROTOCOL_VERSION,
            "libzmq": zmq.zmq_version(),
            "pyzmq": zmq.pyzmq_version(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "excluded": "server-side policy.infer time (measured per request)",
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vla-runtime bench transport")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--curve", action="store_true", help="encrypt with CURVE")
    parser.add_argument("--json", action="store_true", help="(output is always one JSON object)")
    args = parser.parse_args(argv)
    print(json.dumps(run_bench(n=args.n, curve=args.curve)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
