"""Which policy the engine drives: a local back end (`engine/factory.py`) or a policy server."""

from __future__ import annotations

from dataclasses import dataclass

from vla_runtime.engine import factory
from vla_runtime.engine.policy import Policy
from vla_runtime.engine.remote.client import RemoteClient
from vla_runtime.engine.remote.keys import load_client_keys

BACKENDS = (*factory.BACKENDS, "remote")


@dataclass(frozen=True)
class PolicySource:
    """What the engine drives: built from the engine node's parameters of the same names."""

    backend: str  # one of BACKENDS
    checkpoint: str  # empty: random weights of `preset`
    preset: str
    device: str
    seed: int
    threads: int  # CPU threads of torch / ONNX Runtime / OpenMP
    noise_scale: float | None
    endpoint: str  # the policy server (backend remote)
    curve_keys: str  # CurveZMQ key directory; empty: plain TCP
    remote_timeout_s: float

    @property
    def location(self) -> str:
        """Where the policy runs: the server's endpoint or the local device."""
        return self.endpoint if self.backend == "remote" else self.device

    def open(self) -> Policy:
        """The policy; a remote one connects on first use (the server may not be up yet)."""
        if self.backend == "remote":
            server_key, client_keys = None, None
            if self.curve_keys:
                server_key, client_keys = load_client_keys(self.curve_keys)
            return RemoteClient(
                self.endpoint,
                server_public_key=server_key,
                client_keys=client_keys,
                timeout_s=self.remote_timeout_s,
                connect=False,
            )
        return factory.load_policy(
            backend=self.backend,
            checkpoint=self.checkpoint or None,
            preset=self.preset,
            device=self.device,
            seed=self.seed,
            threads=self.threads,
            noise_scale=self.noise_scale,
        )
