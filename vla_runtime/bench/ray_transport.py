"""Ray Serve fleet serving figures (extra `vla_runtime[fleet]`): HTTP overhead and
multi-robot throughput, batched (`@serve.batch`) against unbatched.

Each function deploys on the running Ray cluster (or starts a local one), measures, and shuts
Serve down again. Robots are client threads of this process, each with its own `RayClient`.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from tqdm import tqdm

from vla_runtime.bench.echo import EchoPolicy, bench_observation, overhead_ms, percentiles
from vla_runtime.bench.progress import stdout_to_stderr, step
from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.core.threads import limit_threads
from vla_runtime.engine.remote import ray_serve
from vla_runtime.engine.remote.ray_client import RayClient

REPLICAS = 2


def overhead(n: int = 500, warmup: int = 50) -> dict:
    """Round trip minus the server's infer time (ms) through Ray's HTTP proxy and the replica
    hop, for `EchoPolicy` (one replica, unbatched: no batch wait in the figure)."""
    with _deployed(policy_factory=EchoPolicy, replicas=1, max_batch_size=1, replica_cpus=0) as url:
        with RayClient(url, "bench", timeout_s=30.0) as client:
            return percentiles(overhead_ms(client, n, warmup))


def throughput(
    robots: int,
    batched: bool,
    seconds: float = 10,
    checkpoint: str | None = None,
    preset: str = "tiny",
    replicas: int = REPLICAS,
) -> float:
    """Full-compute requests/s of `robots` concurrent robots against the torch policy (default:
    the shipped checkpoint) on `replicas` replicas of one torch thread each; batched: up to 8
    requests per forward."""
    with _deployed(
        checkpoint=checkpoint or str(shipped_checkpoint()),
        preset=preset,
        replicas=replicas,
        threads=1,
        max_batch_size=8 if batched else 1,
        batch_wait_timeout_s=0.005,
    ) as url:
        clients = [RayClient(url, f"bench-robot{i}", timeout_s=60.0) for i in range(robots)]
        counts = [0] * robots
        stop = threading.Event()
        start = threading.Barrier(robots + 1)

        def run(index: int) -> None:
            client = clients[index]
            observation = bench_observation(client.spec, index)
            client.infer(observation)  # warm: session, connection, first forward
            start.wait()
            k = 0
            while not stop.is_set():
                k += 1
                observation.stamp = float(k)
                client.infer(observation)
                counts[index] += 1

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(robots)]
        for thread in threads:
            thread.start()
        start.wait(timeout=120)
        begun = time.perf_counter()
        time.sleep(seconds)  # the measurement window itself
        done = sum(counts)
        elapsed = time.perf_counter() - begun
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        for client in clients:
            client.close()
    return done / elapsed


class _deployed:
    """Deploy on loopback for the `with` block; start (and stop) a local cluster if needed."""

    def __init__(self, **options):
        self.options = options
        self.started_ray = False

    def __enter__(self) -> str:
        import ray

        if not ray.is_initialized():
            cpus = max(REPLICAS, os.cpu_count() or 1)
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
            self.started_ray = True
        url = ray_serve.deploy(port=_free_port(), **self.options)
        deadline = time.monotonic() + 60
        while True:  # the proxy may answer a moment after the application is running
            try:
                RayClient(url, "bench-probe", timeout_s=10.0).close()
                return url
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        ray_serve.shutdown()
        if self.started_ray:
            import ray

            ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fleet_figures(
    n: int = 500, robots=(1, 4, 8), seconds: float = 10.0, bar: tqdm | None = None
) -> dict:
    """`overhead_ms` and `throughput_rps` for `bench transport`, on one local Ray cluster
    (each figure deploys and removes its own application); `bar` advances by one per figure."""
    import ray

    limit_threads(1)
    with stdout_to_stderr():
        ray.init(num_cpus=max(REPLICAS, os.cpu_count() or 1), include_dashboard=False,
                 log_to_driver=False)  # fmt: skip
        try:
            with step(bar, "ray overhead"):
                result = {"overhead_ms": overhead(n), "throughput_rps": {}}
            for count in robots:
                figures = result["throughput_rps"][str(count)] = {}
                for mode in ("unbatched", "batched"):
                    with step(bar, f"ray {count} robots {mode}"):
                        figures[mode] = round(throughput(count, mode == "batched", seconds), 1)
        finally:
            ray.shutdown()
    return result
