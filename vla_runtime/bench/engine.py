"""`vla-runtime bench engine`: latency of every back end × compute mode, reuse accuracy, and on
CUDA eager vs CUDA-graph latency against the weight-bandwidth floor. Returns one dict.

Latencies are measured interleaved (every back end × mode once per iteration, each with its
own caches), so the ratios (`ort_vs_torch_speedup`: torch / ORT p50 at v0d0;
`reuse_vs_full_speedup`: v0d0 / v4d0; `instruction_kv_speedup`: v0d0 / v1d0) come from one
time window. A reuse mode's p99 includes its periodic refresh (every `max_reuse` + 1 calls).
`max_abs_err` compares each cache-reuse path with full recomputation on identical inputs and
noise.
"""

from __future__ import annotations

import copy
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from vla_runtime.bench.progress import bench_bar
from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine.checkpoint import random_checkpoint
from vla_runtime.engine.model import count_parameters, tokenize
from vla_runtime.engine.onnx_backend import OrtPolicy, default_providers
from vla_runtime.engine.policy import Observation
from vla_runtime.engine.torch_backend import (
    CudaGraphInference,
    TorchPolicy,
    full_inference,
    reference_sample,
)

MODES = tuple(ComputeMode(v, d) for v in range(5) for d in range(3))
H200_BANDWIDTH = 4.8e12  # B/s (FACTS.md)
TARGETS = {"ort_vs_torch_speedup": 1.5, "reuse_vs_full_speedup": 3.0}
RSS_PASSES = 3  # sequential inferences per (back end, mode) that measure its peak RSS


def _observation(spec, seed=0, stamp=0.0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {
        c.name: rng.integers(0, 256, (c.height, c.width, 3), dtype=np.uint8) for c in spec.cameras
    }
    state = rng.normal(size=spec.state_dim).astype(np.float32)
    return Observation(images, state, "pick up the red block and put it in the bowl", stamp)


def _reset_peak_rss() -> None:
    try:  # Linux >= 4.0: writing 5 resets VmHWM, so each mode gets its own peak
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _percentile(values, q) -> float:
    return float(np.percentile(np.asarray(values), q))


def time_modes(
    policies: dict, spec, modes, iterations, warmup, bar, rss_passes: int = RSS_PASSES
) -> dict:
    """Latency of every (back end, mode), interleaved: each iteration runs every pair once, so
    all ratios come from the same time window even when the host's load drifts. Each pair has
    its own caches (a shallow copy of the policy sharing weights/sessions). `rss_passes`: the
    sequential inferences per pair that measure its peak RSS (0: none)."""
    runs = {}
    for backend, policy in policies.items():
        for mode in modes:
            clone = copy.copy(policy)
            clone.reset()
            clone.reseed(0)
            runs[backend, mode.token] = (clone, mode, _observation(spec))
    latencies = {key: [] for key in runs}
    stages = {key: {"vision": [], "backbone": [], "action_head": []} for key in runs}
    applied = {key: set() for key in runs}
    for i in range(warmup + iterations):
        bar.set_postfix_str("warm-up" if i < warmup else "timed")
        for key, (policy, mode, obs) in runs.items():
            obs.stamp = (i + 1) * 2 * spec.dt  # two actions executed between requests
            start = time.perf_counter()
            chunk = policy.infer(obs, mode)
            elapsed = (time.perf_counter() - start) * 1e3
            bar.update(1)
            if i < warmup:  # also fills the caches the mode reuses
                continue
            latencies[key].append(elapsed)
            for stage, values in stages[key].items():
                values.append(chunk.timings_ms[stage])
            applied[key].add(chunk.mode.token)

    results: dict = {backend: {} for backend in policies}
    bar.set_postfix_str("peak RSS")
    for (backend, token), (policy, mode, obs) in runs.items():
        _reset_peak_rss()  # peak RSS: a short sequential pass per mode
        for _ in range(rss_passes):
            obs.stamp += 2 * spec.dt
            policy.infer(obs, mode)
            bar.update(1)
        results[backend][token] = {
            "p50_ms": _percentile(latencies[backend, token], 50),
            "p99_ms": _percentile(latencies[backend, token], 99),
            "peak_rss_mb": _peak_rss_mb() if rss_passes else None,
            "stage_p50_ms": {k: statistics.median(v) for k, v in stages[backend, token].items()},
            "modes_applied": sorted(applied[backend, token]),
        }
    return results


def _reuse_errors(checkpoint, device) -> dict:
    """Max abs error of each reuse path against full recomputation (same inputs, same noise)."""
    spec, steps = checkpoint.spec, checkpoint.config.num_steps
    shape = (spec.chunk_len, spec.action_dim)
    noise = np.random.default_rng(0).standard_normal((4, *shape), dtype=np.float32)

    def fresh(obs):
        return reference_sample(checkpoint, obs, noise[:1], steps)[0]

    policy = TorchPolicy(checkpoint, device=device)
    first, second = _observation(spec, 1), _observation(spec, 2)
    errors = {}
    policy.reseed(0)
    errors["prefix_kv_across_steps"] = np.abs(policy.infer(first).actions - fresh(first)).max()
    policy.reseed(0)
    chunk = policy.infer(second, ComputeMode(1, 0))
    errors["instruction_kv"] = np.abs(chunk.actions - fresh(second)).max()
    moved = Observation(second.images, second.state + 0.1, second.instruction)
    policy.reseed(0)
    chunk = policy.infer(moved, ComputeMode(2, 0))
    errors["stable_camera_kv"] = np.abs(chunk.actions - fresh(moved)).max()
    moved = Observation(second.images, second.state - 0.1, second.instruction)
    policy.reseed(0)
    chunk = policy.infer(moved, ComputeMode(3, 0))
    errors["prefix_except_state"] = np.abs(chunk.actions - fresh(moved)).max()
    policy.reseed(0)
    candidates = policy.sample_candidates(first, 4)
    expected = reference_sample(checkpoint, first, noise, steps)
    errors["batched_candidates"] = np.abs(candidates - expected).max()
    return {k: float(v) for k, v in errors.items()}


def _cuda_figures(checkpoint, iterations, warmup, bandwidth, bar) -> dict:
    """Eager vs CUDA-graph latency of one uncached inference, and the weight-bandwidth floor."""
    model, cfg, spec = checkpoint.model.to("cuda"), checkpoint.config, checkpoint.spec
    obs = _observation(spec)
    text = torch.from_numpy(tokenize(obs.instruction, cfg.max_text_len))[None].cuda()
    images = torch.stack([torch.from_numpy(obs.images[c.name]) for c in spec.cameras])
    images = images[None].cuda()
    state = torch.from_numpy(obs.state)[None].cuda()
    noise = torch.randn(1, spec.chunk_len, spec.action_dim, device="cuda")
    steps = cfg.num_steps

    def timed(fn) -> list[float]:
        for _ in range(warmup):
            fn()
            bar.update(1)
        torch.cuda.synchronize()
        out = []
        for _ in range(iterations):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - start) * 1e3)
            bar.update(1)
        return out

    with torch.no_grad():
        bar.set_postfix_str("cuda eager")
        eager = timed(lambda: full_inference(model, text, images, state, noise, steps))
        bar.set_postfix_str("cuda graph")
        graph = CudaGraphInference(model, text, images, state, noise, steps)
        replay = timed(lambda: graph.run(text, images, state, noise))
        replayed = graph.run(text, images, state, noise).clone()
        reference = full_inference(model, text, images, state, noise, steps)
        err = (replayed - reference).abs().max().item()

    def weight_bytes(modules) -> int:
        return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())

    total = weight_bytes([model])
    expert_parts = [
        model.expert,
        model.action_in,
        model.time_mlp,
        model.expert_norm,
        model.action_out,
    ]
    expert = weight_bytes(expert_parts)
    floor_once = total / bandwidth * 1e3
    # the expert's weights are read once per denoising step
    floor_steps = (total + (steps - 1) * expert) / bandwidth * 1e3
    eager_p50, graph_p50 = _percentile(eager, 50), _percentile(replay, 50)
    return {
        "gpu": torch.cuda.get_device_name(),
        "dtype": str(next(model.parameters()).dtype),
        "eager_p50_ms": eager_p50,
        "eager_p99_ms": _percentile(eager, 99),
        "cuda_graph_p50_ms": graph_p50,
        "cuda_graph_p99_ms": _percentile(replay, 99),
        "cuda_graph_speedup": eager_p50 / graph_p50,
        "cuda_graph_max_abs_err": err,
        "weight_bytes": total,
        "memory_bandwidth_Bps": bandwidth,
        "weight_floor_ms": floor_once,
        "weight_floor_with_steps_ms": floor_steps,
        "cuda_graph_vs_floor": graph_p50 / floor_once,
        "cuda_graph_vs_floor_with_steps": graph_p50 / floor_steps,
        "peak_gpu_memory_mb": torch.cuda.max_memory_allocated() / 2**20,
    }


def run_bench(
    preset: str = "tiny",
    device: str = "cpu",
    backends=("torch", "onnxruntime"),
    iterations: int = 20,
    warmup: int = 3,
    modes=MODES,
    threads: int | None = None,
    seed: int = 0,
    memory_bandwidth: float = H200_BANDWIDTH,
    engine_cache: str | None = None,
    progress: bool = True,
) -> dict:
    """Benchmark figures as one JSON-serialisable dict (see module docstring).

    `threads` defaults to 1 on CPU: both back ends then get the same single core, and the
    figures survive a shared host (ORT's spinning thread pool collapses under contention);
    pass more on a dedicated machine. On CUDA, onnxruntime is skipped unless its CUDA
    execution provider is installed. `progress`: a bar on stderr over the inferences."""
    if device.startswith("cuda"):
        suffix, visible = device.partition(":")[2], torch.cuda.device_count()
        if (int(suffix) if suffix.isdigit() else 0) >= visible:
            raise ValueError(
                f"--device {device}: no such CUDA device here ({visible} visible, torch "
                f"{torch.__version__})"
            )
    previous_threads = torch.get_num_threads()
    threads = threads or (1 if device == "cpu" else previous_threads)
    torch.set_num_threads(threads)
    # every inference of the latency and peak-RSS passes, and of CUDA's eager and graph runs
    per_pair = warmup + iterations + RSS_PASSES
    cuda_runs = 2 * (warmup + iterations) if device.startswith("cuda") else 0
    total = len(backends) * len(modes) * per_pair + cuda_runs
    try:
        with bench_bar("engine", total, progress, unit="infer") as bar:
            return _run(
                preset,
                device,
                backends,
                iterations,
                warmup,
                modes,
                threads,
                seed,
                memory_bandwidth,
                engine_cache,
                bar,
                per_pair * len(modes),
            )
    finally:
        torch.set_num_threads(previous_threads)


def _run(
    preset, device, backends, iterations, warmup, modes, threads, seed, bandwidth, cache, bar,
    per_backend,
):  # fmt: skip
    """`bar` counts inferences, `per_backend` of them for each back end that runs."""
    checkpoint = random_checkpoint(preset, seed)
    policies, skipped = {}, {}
    for backend in backends:
        if backend == "torch":
            policies[backend] = TorchPolicy(checkpoint, device=device, seed=seed)
        elif backend == "onnxruntime":
            if device != "cpu" and len(default_providers(device)) == 1:
                skipped[backend] = "onnxruntime has no CUDA execution provider here"
                bar.total -= per_backend
                continue
            bar.set_postfix_str("onnx export")
            cache = cache or tempfile.mkdtemp(prefix="vla-bench-onnx-")
            start = time.perf_counter()
            policies[backend] = OrtPolicy.from_checkpoint(
                checkpoint, cache_dir=cache, device=device, seed=seed, threads=threads
            )
            export_s = time.perf_counter() - start
        else:
            raise ValueError(f"bench engine supports torch and onnxruntime, not {backend!r}")

    result: dict = {
        "settings": {
            "preset": preset,
            "device": device,
            "backends": list(backends),
            "iterations": iterations,
            "warmup": warmup,
            "threads": threads,
            "parameters": count_parameters(checkpoint.model),
            "num_steps": checkpoint.config.num_steps,
            "max_reuse": next(iter(policies.values())).max_reuse if policies else None,
            "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(),
        },
        "targets": TARGETS,
        "skipped": skipped,
        "latency": time_modes(policies, checkpoint.spec, modes, iterations, warmup, bar),
    }
    if "onnxruntime" in policies:
        result["settings"]["onnxruntime"] = onnxruntime.__version__
        result["settings"]["ort_providers"] = policies["onnxruntime"].providers
        result["settings"]["onnx_export_s"] = export_s

    def p50(backend, token):
        return result["latency"][backend].get(token, {}).get("p50_ms")

    first = next(iter(policies))
    ratios = {}
    for name in policies:
        full, reuse, instr = p50(name, "v0d0"), p50(name, "v4d0"), p50(name, "v1d0")
        ratios[name] = {
            "reuse_vs_full_speedup": full / reuse if full and reuse else None,
            "instruction_kv_speedup": full / instr if full and instr else None,
        }
    result["ratios_by_backend"] = ratios
    result["reuse_vs_full_speedup"] = ratios[first]["reuse_vs_full_speedup"]
    result["instruction_kv_speedup"] = ratios[first]["instruction_kv_speedup"]
    if {"torch", "onnxruntime"} <= set(policies):
        result["ort_vs_torch_speedup"] = p50("torch", "v0d0") / p50("onnxruntime", "v0d0")

    bar.set_postfix_str("reuse errors")
    result["max_abs_err"] = _reuse_errors(checkpoint, device)
    if {"torch", "onnxruntime"} <= set(policies):
        obs = _observation(checkpoint.spec, 3)
        for policy in policies.values():
            policy.reset()
            policy.reseed(1)
        a = policies["torch"].infer(obs).actions
        b = policies["onnxruntime"].infer(obs).actions
        result["max_abs_err"]["ort_vs_torch"] = float(np.abs(a - b).max())

    if device.startswith("cuda"):
        result["cuda"] = _cuda_figures(checkpoint, iterations, warmup, bandwidth, bar)
    return result
