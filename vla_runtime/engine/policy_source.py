"""Which policy the engine drives: a local back end (`engine/factory.py`) or a policy server
(ours over ZeroMQ, `remote`; any openpi policy server, `openpi`; a Ray Serve fleet, `ray`) or a
Python callable that builds a `Policy` (`python`: checkpoint `package.module:callable`, called
with `robot`, `seed` and the keyword arguments of `policy_args`, a JSON object), so a policy
that is not a network (a scripted expert acting on perception) runs in the same engine node."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from vla_runtime.engine import factory
from vla_runtime.engine.checkpoint import load_spec
from vla_runtime.engine.policy import Policy
from vla_runtime.engine.remote.client import RemoteClient
from vla_runtime.engine.remote.keys import load_client_keys
from vla_runtime.engine.remote.openpi_policy import OpenpiPolicy
from vla_runtime.engine.remote.openpi_protocol import DEFAULT_PORT as OPENPI_PORT
from vla_runtime.engine.remote.protocol import DEFAULT_ENDPOINT
from vla_runtime.engine.remote.ray_client import RayClient

BACKENDS = (*factory.BACKENDS, "remote", "openpi", "ray", "python")
DEFAULT_ENDPOINTS = {
    "remote": DEFAULT_ENDPOINT,
    "openpi": f"ws://127.0.0.1:{OPENPI_PORT}",
    "ray": "http://127.0.0.1:8000/",
}


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
    endpoint: str  # the policy server (backend remote, openpi, ray); empty: its loopback default
    curve_keys: str  # CurveZMQ key directory; empty: plain TCP
    remote_timeout_s: float
    openpi_image_keys: tuple[str, ...] = ()  # empty: observation/<camera>
    openpi_state_key: str = "observation/state"
    api_key_file: str = ""  # openpi, ray: a file holding this robot's API key
    tls_ca: str = ""  # openpi, ray over TLS: CA bundle of the server's certificate
    robot: str = "fr3"  # the arm driven: random weights get its columns
    policy_args: str = ""  # python: JSON object of the callable's keyword arguments

    @property
    def location(self) -> str:
        """Where the policy runs: the server's endpoint or the local device."""
        return self.server if self.backend in DEFAULT_ENDPOINTS else self.device

    @property
    def server(self) -> str:
        return self.endpoint or DEFAULT_ENDPOINTS.get(self.backend, "")

    def open(self) -> Policy:
        """The policy; a remote one connects on first use (the server may not be up yet)."""
        if self.backend == "openpi":
            return self._openpi()
        if self.backend == "python":
            return self._python()
        if self.backend == "ray":
            return RayClient(
                self.server,
                token=self._api_key(),
                timeout_s=self.remote_timeout_s,
                connect=False,
                verify=self.tls_ca or True,
            )
        if self.backend == "remote":
            server_key, client_keys = None, None
            if self.curve_keys:
                server_key, client_keys = load_client_keys(self.curve_keys)
            return RemoteClient(
                self.server,
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
            robot=self.robot,
        )

    def _openpi(self) -> OpenpiPolicy:
        """An openpi server's policy; `checkpoint` (its spec.json) describes one that is not
        vla_runtime's own."""
        return OpenpiPolicy(
            self.server,
            spec=load_spec(self.checkpoint) if self.checkpoint else None,
            image_keys=tuple(self.openpi_image_keys),
            state_key=self.openpi_state_key,
            api_key=self._api_key(),
            timeout_s=self.remote_timeout_s,
            connect_now=False,
            tls_ca=self.tls_ca or None,
        )

    def _python(self) -> Policy:
        module, _, name = self.checkpoint.partition(":")
        if not module or not name:
            raise ValueError(f"backend python needs checkpoint 'package.module:callable', "
                             f"got {self.checkpoint!r}")  # fmt: skip
        try:
            arguments = json.loads(self.policy_args or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"policy_args is not JSON: {exc}") from exc
        if not isinstance(arguments, dict):
            raise ValueError("policy_args must be a JSON object")
        build = getattr(importlib.import_module(module), name, None)
        if not callable(build):
            raise ValueError(f"{self.checkpoint}: {module} has no callable {name!r}")
        return build(robot=self.robot, seed=self.seed, **arguments)

    def _api_key(self) -> str | None:
        return Path(self.api_key_file).read_text().strip() if self.api_key_file else None
