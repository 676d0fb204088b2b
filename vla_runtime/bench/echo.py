"""A zero-cost policy and its observation for transport measurements: what remains of a round
trip is framing, sockets, (de)serialisation and session logic."""

from __future__ import annotations

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
