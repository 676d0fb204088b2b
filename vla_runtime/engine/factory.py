"""One entry point for local back ends: `load_policy(backend, checkpoint, preset, device, seed)`."""

from __future__ import annotations

from vla_runtime.core.policy_checkpoint import LOCAL_BACKENDS
from vla_runtime.core.threads import limit_threads
from vla_runtime.engine.built_engine import is_engine_dir, load_engine
from vla_runtime.engine.checkpoint import load_checkpoint, policy_options, random_checkpoint
from vla_runtime.engine.model import default_spec
from vla_runtime.engine.onnx_backend import OrtPolicy
from vla_runtime.engine.policy import Policy, PolicyError
from vla_runtime.engine.tensorrt_backend import load_tensorrt_policy
from vla_runtime.engine.torch_backend import TorchPolicy

BACKENDS = LOCAL_BACKENDS


def load_policy(
    backend: str = "torch",
    checkpoint: str | None = None,
    preset: str = "tiny",
    device: str = "cpu",
    seed: int = 0,
    threads: int | None = None,
    robot: str = "fr3",
    **options,
) -> Policy:
    """`checkpoint`: a local directory (model.safetensors + spec.json), or an engine built by
    `vla-runtime build-engine` (checked against its manifest, run by the back end it was built
    for); None = random weights of `preset` for `robot`'s columns. `threads`: CPU threads for
    torch / ONNX Runtime / OpenMP (0 = the host default, None = leave the process's settings
    alone). `options` go to the policy (max_reuse, candidates, warm_steps, noise_scale;
    onnxruntime also cache_dir); options the checkpoint recommends apply unless given here
    (None: not given)."""
    if threads is not None:
        threads = limit_threads(threads)
    if checkpoint and is_engine_dir(checkpoint):
        if backend == "tensorrt" and device == "cpu":
            device = "cuda"
        return load_engine(checkpoint, backend, device, seed, threads, **options)
    if backend == "tensorrt":  # builds (or loads cached) plans from the ONNX export
        device = "cuda" if device == "cpu" else device
        return load_tensorrt_policy(checkpoint, preset, seed, device, **options)
    if checkpoint:
        loaded = load_checkpoint(checkpoint)
    else:
        loaded = random_checkpoint(preset, seed, default_spec(robot=robot))
    options = policy_options(loaded, options)
    if backend == "torch":
        return TorchPolicy(loaded, device=device, seed=seed, **options)
    if backend in ("onnxruntime", "ort"):
        return OrtPolicy.from_checkpoint(
            loaded, device=device, seed=seed, threads=threads, **options
        )
    raise PolicyError(f"unknown back end {backend!r}; local back ends: {list(BACKENDS)}")
