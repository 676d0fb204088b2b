"""Built engines: one checkpoint prepared for one back end, precision and device, in
`engines/<checkpoint-name>-<hash>/`, with a manifest that is checked before anything in the
directory is loaded.

onnxruntime: every exported graph optimised once by ONNX Runtime for the target device (graph
optimisation level ALL, written with `SessionOptions.optimized_model_filepath`), fp32 only.
tensorrt: the export copied into `onnx/` and its plans built by `tensorrt_backend` into
`tensorrt/` (the plan cache layout, keyed by ONNX hash, GPU, precision and TensorRT version).

manifest.json: the export's manifest (files, io, spec, model, normalization: what the back end
runs from), plus `kind`, `backend`, `precision`, `device`, `gpu`, `versions` (Python, torch,
onnx, onnxruntime; tensorrt, CUDA and the NVIDIA driver where present), `built_at` (UTC),
`checkpoint` {name, path, model_hash, spec_sha256}, `source_onnx_sha256` (the export the engine
was built from) and `sha256` {relative path: digest} of every file the back end reads. Loading
checks every digest and the spec hash: a changed file or spec is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

from vla_runtime.engine.checkpoint import (
    Checkpoint,
    load_checkpoint,
    model_hash,
    random_checkpoint,
    resolve_checkpoint_dir,
)
from vla_runtime.engine.onnx_backend import MANIFEST, OrtPolicy, default_providers, export_onnx
from vla_runtime.engine.policy import Policy, PolicyError
from vla_runtime.engine.tensorrt_backend import (
    TensorRTPolicy,
    file_sha256,
    gpu_identity,
    import_tensorrt,
)

KIND = "vla_runtime.engine"
ENGINE_FORMAT = 1
ENGINE_BACKENDS = ("onnxruntime", "tensorrt")
ENGINE_PRECISIONS = ("fp32", "fp16")
ONNX_SUBDIR = "onnx"  # tensorrt: the export the plans were built from
TENSORRT_MAX_BATCH = 8  # plans' batch range (candidates share a prefix at B > 1)
DRIVER_QUERY_TIMEOUT_S = 10.0


def spec_sha256(spec: dict, model: dict, normalization: dict) -> str:
    """Digest of what the engine's numbers mean: policy spec, model config and normalisation."""
    canonical = json.dumps(
        {"spec": spec, "model": model, "normalization": normalization}, sort_keys=True
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def checkpoint_spec_sha256(checkpoint: Checkpoint) -> str:
    return spec_sha256(
        checkpoint.spec.to_dict(),
        checkpoint.config.to_dict(),
        checkpoint.normalization.to_dict(),
    )


def read_manifest(directory: str | Path) -> dict | None:
    """The engine manifest of `directory`; None when it is not a built engine."""
    try:
        manifest = json.loads((Path(directory) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("kind") == KIND else None


def is_engine_dir(directory: str | Path) -> bool:
    return read_manifest(directory) is not None


def library_versions() -> dict:
    """Versions an engine depends on; tensorrt, CUDA and the driver only where present."""
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
    }
    try:
        import tensorrt

        versions["tensorrt"] = tensorrt.__version__
    except ImportError:
        pass
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    driver = _nvidia_driver_version()
    if driver:
        versions["nvidia_driver"] = driver
    return versions


def _nvidia_driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=DRIVER_QUERY_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _device_kind(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


def _check_request(backend: str, precision: str, device: str) -> None:
    """Refuse what cannot be built, in one line, before any export work."""
    if backend not in ENGINE_BACKENDS:
        raise PolicyError(f"backend must be one of {ENGINE_BACKENDS}, got {backend!r}")
    if precision not in ENGINE_PRECISIONS:
        raise PolicyError(f"precision must be one of {ENGINE_PRECISIONS}, got {precision!r}")
    if device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
        raise PolicyError(f"device must be cpu or cuda[:N], got {device!r}")
    if backend == "onnxruntime":
        if precision == "fp16" and device == "cpu":
            raise PolicyError(
                "onnxruntime fp16 on CPU is refused: ONNX Runtime's CPU provider has no fp16 "
                "kernels for most of these graphs (they would run slower than fp32); use "
                "--precision fp32, or --backend tensorrt --precision fp16 on a GPU"
            )
        if precision == "fp16":
            raise PolicyError(
                "onnxruntime engines are built in fp32 (the graphs are not converted to fp16); "
                "for fp16 on a GPU use --backend tensorrt --precision fp16"
            )
        if device != "cpu" and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise PolicyError(
                f"device {device} needs ONNX Runtime's CUDAExecutionProvider, which this "
                f"onnxruntime {ort.__version__} does not have (providers: "
                f"{ort.get_available_providers()})"
            )
    if backend == "tensorrt":
        try:
            import_tensorrt()
        except ImportError as exc:
            raise PolicyError(f"cannot build a TensorRT engine here: {exc}") from None
        if device == "cpu" or not torch.cuda.is_available():
            raise PolicyError(
                f"cannot build a TensorRT engine here: it needs a CUDA device (got {device!r}, "
                f"torch sees {torch.cuda.device_count()} CUDA device(s))"
            )


def engine_name(
    checkpoint: Checkpoint, name: str, backend: str, precision: str, device: str
) -> str:
    """`<checkpoint-name>-<hash>`: the hash covers the weights, spec, back end, precision and
    the device kind (and the GPU model for TensorRT, whose plans are specific to it)."""
    gpu = gpu_identity(device)[0] if backend == "tensorrt" else ""
    key = json.dumps([model_hash(checkpoint), backend, precision, _device_kind(device), gpu])
    return f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_engine(
    checkpoint_dir: str | None,
    backend: str,
    precision: str = "fp32",
    device: str = "cpu",
    out: str | Path = "engines",
    preset: str = "tiny",
    seed: int = 0,
) -> Path:
    """Build `out/<checkpoint-name>-<hash>/` (replacing an older build of the same name) and
    return it. `checkpoint_dir` None: random weights of `preset` (seeded), named
    `random-<preset>-seed<seed>`."""
    _check_request(backend, precision, device)
    if checkpoint_dir:
        source = resolve_checkpoint_dir(checkpoint_dir)
        checkpoint = load_checkpoint(source)
        name, source_path = source.resolve().name, str(source.resolve())
    else:
        checkpoint = random_checkpoint(preset, seed)
        name, source_path = f"random-{preset}-seed{seed}", ""
    export_dir = export_onnx(checkpoint)
    export = json.loads((export_dir / MANIFEST).read_text())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / engine_name(checkpoint, name, backend, precision, device)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    try:
        if backend == "onnxruntime":
            details = _build_onnxruntime(export_dir, export, staging, device)
        else:
            details = _build_tensorrt(export_dir, export, staging, device, precision)
        manifest = {
            **export,
            **details,
            "kind": KIND,
            "engine_format": ENGINE_FORMAT,
            "backend": backend,
            "precision": precision,
            "device": device,
            "versions": library_versions(),
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "checkpoint": {
                "name": name,
                "path": source_path,
                "model_hash": model_hash(checkpoint),
                "spec_sha256": checkpoint_spec_sha256(checkpoint),
            },
            "inference": checkpoint.inference,
            "source_onnx_sha256": {
                file: file_sha256(export_dir / file) for file in export["files"].values()
            },
            "sha256": {
                str(path.relative_to(staging)): file_sha256(path)
                for path in sorted(staging.rglob("*"))
                if path.is_file()
            },
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _build_onnxruntime(export_dir: Path, export: dict, staging: Path, device: str) -> dict:
    providers = default_providers(device)
    for name, file in export["files"].items():
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(staging / file)
        # Errors only: ORT warns on every graph that level ALL may use this machine's CPU
        # features; engines are built on the machine kind that runs them (engines/README.md).
        options.log_severity_level = 3
        # Weights beside the graph: protobuf caps one file at 2 GB (larger presets).
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", f"{name}.onnx.data"
        )
        ort.InferenceSession(str(export_dir / file), options, providers=providers)
    return {
        "graph_optimization_level": "ORT_ENABLE_ALL",
        "providers": [p if isinstance(p, str) else p[0] for p in providers],
        "gpu": _gpu(device),
    }


def _build_tensorrt(
    export_dir: Path, export: dict, staging: Path, device: str, precision: str
) -> dict:
    shutil.copytree(export_dir, staging / ONNX_SUBDIR)
    # Building is TensorRTPolicy's plan cache, rooted in the engine directory.
    policy = TensorRTPolicy(
        staging / ONNX_SUBDIR,
        device=device,
        precision=precision,
        cache_root=staging,
        max_batch=TENSORRT_MAX_BATCH,
        rebuild=True,
    )
    return {
        "files": {stage: f"{ONNX_SUBDIR}/{file}" for stage, file in export["files"].items()},
        "plans": {
            stage: str(path.relative_to(staging)) for stage, path in policy.plan_paths.items()
        },
        "max_batch": TENSORRT_MAX_BATCH,
        "gpu": _gpu(device),
    }


def _gpu(device: str) -> dict | None:
    if _device_kind(device) != "cuda" or not torch.cuda.is_available():
        return None
    name, capability = gpu_identity(device)
    return {"name": name, "compute_capability": list(capability)}


def verify_engine(directory: str | Path) -> dict:
    """The manifest of a built engine whose files and spec are as built; PolicyError (one line)
    for anything else."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        raise PolicyError(f"{directory} is not a built engine (no {MANIFEST} of kind {KIND!r})")
    if manifest.get("engine_format") != ENGINE_FORMAT:
        raise PolicyError(f"{directory}: engine format {manifest.get('engine_format')}, "
                          f"expected {ENGINE_FORMAT}: build it again")  # fmt: skip
    try:
        digests = manifest["sha256"]
        recorded = manifest["checkpoint"]["spec_sha256"]
        actual = spec_sha256(manifest["spec"], manifest["model"], manifest["normalization"])
    except (KeyError, TypeError) as exc:
        raise PolicyError(f"{directory / MANIFEST}: incomplete engine manifest ({exc})") from None
    if actual != recorded:
        raise PolicyError(f"{directory}: the manifest's spec, model or normalisation does not "
                          "match the checkpoint the engine was built from; refused")  # fmt: skip
    needed = set(manifest.get("files", {}).values()) | set(manifest.get("plans", {}).values())
    unlisted = sorted(needed - set(digests))
    if unlisted:
        raise PolicyError(f"{directory}: {unlisted[0]} has no recorded hash; refused")
    for relative, digest in digests.items():
        path = directory / relative
        if not path.is_file():
            raise PolicyError(f"{directory}: {relative} is missing; refused")
        if file_sha256(path) != digest:
            raise PolicyError(f"{directory}: {relative} differs from the file the engine was "
                              "built with (SHA-256 mismatch); refused")  # fmt: skip
    return manifest


def load_engine(
    directory: str | Path,
    backend: str,
    device: str = "cpu",
    seed: int = 0,
    threads: int | None = None,
    **options,
) -> Policy:
    """The policy of a built engine, after `verify_engine`. `backend` and the device kind must be
    the ones it was built for; `options` as for `factory.load_policy` (None: not given)."""
    directory = Path(directory)
    manifest = verify_engine(directory)
    built = manifest["backend"]
    if backend not in (built, "ort" if built == "onnxruntime" else built):
        raise PolicyError(f"{directory} is a {built} engine; load it with backend {built}, "
                          f"not {backend}")  # fmt: skip
    if _device_kind(device) != _device_kind(manifest["device"]):
        raise PolicyError(f"{directory} was built for {manifest['device']}; device {device} "
                          "needs its own build (vla-runtime build-engine)")  # fmt: skip
    options = {**manifest.get("inference", {}), **{k: v for k, v in options.items()
                                                    if v is not None}}  # fmt: skip
    if built == "onnxruntime":
        return OrtPolicy(directory, device=device, seed=seed, threads=threads, **options)
    return _load_tensorrt(directory, manifest, device, seed, options)


def _load_tensorrt(directory: Path, manifest: dict, device: str, seed: int, options: dict):
    try:
        trt = import_tensorrt()
    except ImportError as exc:
        raise PolicyError(f"cannot load the TensorRT engine {directory}: {exc}") from None
    built_with = manifest["versions"].get("tensorrt")
    if trt.__version__ != built_with:
        raise PolicyError(f"{directory} was built with TensorRT {built_with}, this is "
                          f"{trt.__version__}: build it again here")  # fmt: skip
    if not torch.cuda.is_available():
        raise PolicyError(f"the TensorRT engine {directory} needs a CUDA device")
    name, capability = gpu_identity(device)
    gpu = manifest.get("gpu") or {}
    if [name, list(capability)] != [gpu.get("name"), gpu.get("compute_capability")]:
        raise PolicyError(f"{directory} was built for {gpu.get('name')}, this is {name}: "
                          "build it again on this GPU")  # fmt: skip
    return TensorRTPolicy(
        directory / ONNX_SUBDIR,
        device=device,
        seed=seed,
        precision=manifest["precision"],
        cache_root=directory,
        max_batch=manifest["max_batch"],
        **options,
    )
