"""A zero-cost policy and its observation for transport measurements: what remains of a round
trip is framing, sockets, (de)serialisation and session logic."""

from __future__ import annotations

import time

import numpy as np

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode
from vla_runtime.engine.policy import ActionChunk, CameraSpec, Observation, PolicySpec

BENCH_SPEC = PolicySpec(
    cameras=(CameraSpec("scene", 224, 224), CameraSpec("wrist", 224, 224)),
    state_dim=8,
    action_dim=8,
    chunk_len=50,
    dt=0.02,
)


class EchoPolicy:
    """A fixed chunk stamped like the input."""

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


def bench_observation(spec: PolicySpec = BENCH_SPEC, seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {
        c.name: rng.integers(0, 256, (c.height, c.width, 3), dtype=np.uint8) for c in spec.cameras
    }
    state = rng.normal(size=spec.state_dim).astype(np.float32)
    return Observation(images, state, "pick up the red cube")


def overhead_ms(client, n: int, warmup: int) -> np.ndarray:
    """`n` round trips of `client` (after `warmup`) minus the server's own infer time, in ms."""
    observation = bench_observation()
    overhead = np.empty(n)
    for i in range(warmup + n):
        observation.stamp = float(i)
        started = time.perf_counter()
        chunk = client.infer(observation)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if chunk.stamp != observation.stamp:
            raise RuntimeError("reply does not belong to the request")
        if i >= warmup:
            overhead[i - warmup] = elapsed_ms - chunk.info["server_infer_ms"]
    return overhead


def percentiles(samples: np.ndarray) -> dict:
    return {
        "p50": round(float(np.percentile(samples, 50)), 3),
        "p99": round(float(np.percentile(samples, 99)), 3),
        "max": round(float(samples.max()), 3),
    }
