"""TensorRT back end: the five ONNX stages of `onnx_backend` built into TensorRT plans.

UNVERIFIED WITHOUT TENSORRT: this module is written against the TensorRT >= 10 Python API
(`trt.Builder`, `trt.OnnxParser`, `IBuilderConfig` precision flags, optimization profiles,
`Runtime.deserialize_cuda_engine`, `IExecutionContext.set_tensor_address` +
`execute_async_v3`) but has only been exercised where `tensorrt` imports and a CUDA GPU is
present. The plan-cache key logic and the optimization-profile derivation are pure and tested
everywhere; the build and run paths are tested only where TensorRT is installed.

Flow: `export_onnx(checkpoint)` (the same files the ONNX Runtime back end runs) -> for each stage
a plan built with one optimization profile per input-shape family (prefix_block has two: a
camera block and the state token) -> cached under `<engines cache>/tensorrt/` keyed by the ONNX
file's SHA-256, the GPU name and compute capability, the precision, the TensorRT version and the
profiles -> `TensorRTPolicy` runs the plans with torch CUDA tensors as I/O buffers on torch's
current stream, inside the same `CachedPolicy` caches and compute modes as every local back end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import torch

from vla_runtime.engine.checkpoint import (
    Normalization,
    load_checkpoint,
    policy_options,
    random_checkpoint,
)
from vla_runtime.engine.kv_cache import CachedPolicy
from vla_runtime.engine.model import ModelConfig
from vla_runtime.engine.onnx_backend import MANIFEST, engine_cache_root, export_onnx
from vla_runtime.engine.policy import PolicyError, PolicySpec

PRECISIONS = ("fp32", "fp16", "bf16")
_PRECISION_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
}
# BuilderFlag enabling each reduced precision (weakly typed networks, TensorRT 10).
_PRECISION_FLAGS = {"fp16": "FP16", "bf16": "BF16"}
STAGES = ("instruction", "vision", "prefix_block", "state_embed", "expert_step")

Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max)


# ------------------------------------------------------------------------------ pure logic


def normalise_precision(precision: str) -> str:
    try:
        return _PRECISION_ALIASES[precision.lower()]
    except KeyError:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}") from None


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gpu_slug(name: str) -> str:
    """'NVIDIA H200 (141GB)' -> 'nvidia-h200-141gb': safe in a file name, still readable."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


@dataclasses.dataclass(frozen=True)
class PlanKey:
    """Everything a serialized plan depends on: a plan built for another model, GPU, precision,
    TensorRT version or set of profiles must never be loaded."""

    stage: str
    onnx_sha256: str
    gpu_name: str
    compute_capability: tuple[int, int]
    precision: str
    trt_version: str
    profiles: tuple[tuple[tuple[str, Shape, Shape, Shape], ...], ...]

    def digest(self) -> str:
        fields = {
            "stage": self.stage,
            "onnx_sha256": self.onnx_sha256,
            "gpu_name": self.gpu_name,
            "compute_capability": list(self.compute_capability),
            "precision": self.precision,
            "trt_version": self.trt_version,
            "profiles": [[list(map(_jsonable, entry)) for entry in p] for p in self.profiles],
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def path(self, root: str | Path) -> Path:
        """<root>/tensorrt/<gpu>-sm<cc>-<precision>-trt<version>/<stage>-<onnx>-<digest>.plan"""
        major, minor = self.compute_capability
        folder = (
            f"{gpu_slug(self.gpu_name)}-sm{major}{minor}-{self.precision}-trt{self.trt_version}"
        )
        name = f"{self.stage}-{self.onnx_sha256[:16]}-{self.digest()[:12]}.plan"
        return Path(root) / "tensorrt" / folder / name


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def make_plan_key(
    stage: str,
    onnx_sha256: str,
    gpu_name: str,
    compute_capability: tuple[int, int],
    precision: str,
    trt_version: str,
    profiles: list[Profile],
) -> PlanKey:
    frozen = tuple(
        tuple((name, *map(tuple, shapes)) for name, shapes in sorted(profile.items()))
        for profile in profiles
    )
    return PlanKey(
        stage,
        onnx_sha256,
        gpu_name,
        tuple(compute_capability),
        normalise_precision(precision),
        trt_version,
        frozen,
    )


def stage_profiles(manifest: dict, max_batch: int = 8) -> dict[str, list[Profile]]:
    """Optimization profiles per stage from the export manifest's I/O table.

    The batch axis B spans 1..max_batch (optimised for 1; candidates share a prefix at B > 1).
    prefix_block gets two profiles because `CachedPolicy` calls it with two shape families:
    a camera block (T = tokens per camera, Tp = text length) and the state token (T = 1,
    Tp = text + every camera)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    io = manifest["io"]
    text_len = int(io["instruction"]["inputs"]["text_ids"][1])
    tokens_per_camera = int(io["vision"]["outputs"]["vision_tokens"][1])
    cameras = len(manifest["spec"]["cameras"])
    families = {
        "prefix_block": [
            {"T": tokens_per_camera, "Tp": text_len},
            {"T": 1, "Tp": text_len + cameras * tokens_per_camera},
        ]
    }
    profiles: dict[str, list[Profile]] = {}
    for stage in STAGES:
        inputs = io[stage]["inputs"]
        stage_profiles_: list[Profile] = []
        for axes in families.get(stage, [{}]):
            profile: Profile = {}
            for name, dims in inputs.items():
                ranges = []  # (min, opt, max) of each axis
                for dim in dims:
                    if dim == "B":
                        ranges.append((1, 1, max_batch))
                    elif isinstance(dim, str):
                        if dim not in axes:
                            raise ValueError(f"{stage}.{name}: no size known for axis {dim!r}")
                        ranges.append((axes[dim],) * 3)
                    else:
                        ranges.append((int(dim),) * 3)
                low, opt, high = (tuple(r[i] for r in ranges) for i in range(3))
                profile[name] = (low, opt, high)
            stage_profiles_.append(profile)
        profiles[stage] = stage_profiles_
    return profiles


def profile_index(profiles: list[Profile], shapes: dict[str, Shape]) -> int:
    """Index of the first profile whose ranges contain every input shape; PolicyError if none."""
    for index, profile in enumerate(profiles):
        if all(
            name in shapes
            and len(shapes[name]) == len(low)
            and all(lo <= s <= hi for lo, s, hi in zip(low, shapes[name], high, strict=True))
            for name, (low, _, high) in profile.items()
        ):
            return index
    raise PolicyError(f"input shapes {shapes} fit no TensorRT optimization profile {profiles}")


# ------------------------------------------------------------------------------ TensorRT


def import_tensorrt():
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise ImportError(
            "the TensorRT back end needs the `tensorrt` Python package (>= 10) and a CUDA GPU; "
            f"it is not importable here ({exc})"
        ) from exc
    major = int(trt.__version__.split(".")[0])
    if major < 10:
        raise ImportError(f"TensorRT >= 10 required, found {trt.__version__}")
    return trt


def build_plan(trt, onnx_path: Path, profiles: list[Profile], precision: str, workspace_bytes):
    """Parse the ONNX file and build a serialized plan (bytes)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: always explicit batch, weakly typed
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # reads external weights beside the file
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise PolicyError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    flag_name = _PRECISION_FLAGS.get(precision)
    if flag_name is not None:
        flag = getattr(trt.BuilderFlag, flag_name, None)
        if flag is None:
            raise PolicyError(
                f"TensorRT {trt.__version__} has no BuilderFlag.{flag_name} (strongly typed "
                "only): use precision fp32 or export the ONNX in the reduced precision"
            )
        config.set_flag(flag)
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in shapes.items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise PolicyError(f"TensorRT failed to build {onnx_path.name} (see the TensorRT log)")
    return bytes(serialized)


def load_or_build_plan(trt, key: PlanKey, onnx_path, profiles, root, workspace_bytes, rebuild):
    """(plan bytes, built now?) — from the cache when present, else built and cached."""
    path = key.path(root)
    if path.is_file() and not rebuild:
        return path.read_bytes(), False
    plan = build_plan(trt, Path(onnx_path), profiles, key.precision, workspace_bytes)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan-")
    with os.fdopen(fd, "wb") as f:
        f.write(plan)
    os.replace(tmp, path)  # atomic: a concurrent reader never sees half a plan
    sidecar = {**dataclasses.asdict(key), "digest": key.digest()}
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2))
    return plan, True


def _torch_dtype(trt, dtype):
    table = {
        "FLOAT": torch.float32,
        "HALF": torch.float16,
        "BF16": torch.bfloat16,
        "INT32": torch.int32,
        "INT64": torch.int64,
        "INT8": torch.int8,
        "UINT8": torch.uint8,
        "BOOL": torch.bool,
    }
    for name, torch_dtype in table.items():
        if getattr(trt.DataType, name, None) == dtype:
            return torch_dtype
    raise PolicyError(f"unsupported TensorRT tensor type {dtype}")


class TrtStage:
    """One deserialized engine with an execution context per optimization profile."""

    def __init__(self, trt, name: str, plan: bytes, profiles: list[Profile], device):
        self.name = name
        self.device = torch.device(device)
        self.profiles = profiles
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self._runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise PolicyError(f"TensorRT could not deserialize the {name} plan")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.inputs = [n for n in names if is_input[n]]
        self.outputs = [n for n in names if not is_input[n]]
        self.dtypes = {n: _torch_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        stream = torch.cuda.current_stream(self.device)
        self.contexts = []
        for index in range(self.engine.num_optimization_profiles):
            context = self.engine.create_execution_context()
            context.set_optimization_profile_async(index, stream.cuda_stream)
            self.contexts.append(context)
        stream.synchronize()

    def __call__(self, **inputs: torch.Tensor) -> torch.Tensor:
        missing = set(self.inputs) - set(inputs)
        if missing:
            raise PolicyError(f"TensorRT stage {self.name} is missing inputs {sorted(missing)}")
        shapes = {n: tuple(t.shape) for n, t in inputs.items()}
        context = self.contexts[profile_index(self.profiles, shapes)]
        keep = []  # buffers must outlive the enqueue; the stream orders their reuse
        for name in self.inputs:
            tensor = inputs[name].to(self.device, self.dtypes[name]).contiguous()
            keep.append(tensor)
            context.set_input_shape(name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        outputs = {}
        for name in self.outputs:
            shape = tuple(context.get_tensor_shape(name))
            outputs[name] = torch.empty(shape, dtype=self.dtypes[name], device=self.device)
            context.set_tensor_address(name, outputs[name].data_ptr())
        stream = torch.cuda.current_stream(self.device)
        if not context.execute_async_v3(stream.cuda_stream):
            raise PolicyError(f"TensorRT execution of stage {self.name} failed")
        return outputs[self.outputs[0]].float()


def gpu_identity(device) -> tuple[str, tuple[int, int]]:
    device = torch.device(device)
    return torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device))


class TensorRTPolicy(CachedPolicy):
    """The Policy protocol on TensorRT plans (same caches and compute modes as torch/ORT).

    `directory`: an `export_onnx` directory (manifest.json + the five .onnx files). RTC guidance
    uses the identity-Jacobian approximation, like ONNX Runtime (no autograd through plans)."""

    def __init__(
        self,
        directory: str | Path,
        device: str = "cuda",
        seed: int = 0,
        precision: str = "fp16",
        cache_root: str | Path | None = None,
        max_batch: int = 8,
        workspace_gb: float = 4.0,
        rebuild: bool = False,
        **options,
    ):
        trt = import_tensorrt()
        if not torch.cuda.is_available() or not str(device).startswith("cuda"):
            raise PolicyError(f"the TensorRT back end needs a CUDA device, got {device!r}")
        self.directory = Path(directory)
        manifest = json.loads((self.directory / MANIFEST).read_text())
        self.precision = normalise_precision(precision)
        root = Path(cache_root) if cache_root is not None else engine_cache_root()
        gpu_name, capability = gpu_identity(device)
        profiles = stage_profiles(manifest, max_batch)
        self.stages: dict[str, TrtStage] = {}
        self.built: list[str] = []  # stages built (not loaded from the plan cache) this time
        self.plan_paths: dict[str, Path] = {}
        for stage in STAGES:
            onnx_path = self.directory / manifest["files"][stage]
            key = make_plan_key(
                stage,
                file_sha256(onnx_path),
                gpu_name,
                capability,
                self.precision,
                trt.__version__,
                profiles[stage],
            )
            plan, built = load_or_build_plan(
                trt, key, onnx_path, profiles[stage], root, workspace_gb * (1 << 30), rebuild
            )
            if built:
                self.built.append(stage)
            self.plan_paths[stage] = key.path(root)
            self.stages[stage] = TrtStage(trt, stage, plan, profiles[stage], device)
        super().__init__(
            PolicySpec.from_dict(manifest["spec"]),
            ModelConfig(**manifest["model"]),
            Normalization.from_dict(manifest["normalization"]),
            device,
            seed,
            **options,
        )

    @classmethod
    def from_checkpoint(cls, checkpoint, onnx_dir=None, **kwargs) -> TensorRTPolicy:
        return cls(export_onnx(checkpoint, onnx_dir), **kwargs)

    def instruction_kv(self, text_ids):
        return self.stages["instruction"](text_ids=text_ids)

    def vision_tokens(self, image, camera_index):
        return self.stages["vision"](image=image, camera_index=camera_index)

    def block_kv(self, tokens, past_kv, past_bias):
        return self.stages["prefix_block"](tokens=tokens, past_kv=past_kv, past_bias=past_bias)

    def state_tokens(self, state):
        return self.stages["state_embed"](state=state)

    def velocity(self, actions, tau, prefix_kv, prefix_bias):
        return self.stages["expert_step"](
            noisy_actions=actions, tau=tau, prefix_kv=prefix_kv, prefix_bias=prefix_bias
        )

    def expand_prefix(self, kv: torch.Tensor, count: int) -> torch.Tensor:
        # Plans read dense buffers: materialise the shared prefix once per call, not per step.
        return kv.expand(-1, -1, count, -1, -1, -1).contiguous()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


def load_tensorrt_policy(
    checkpoint: str | None = None,
    preset: str = "tiny",
    seed: int = 0,
    device: str = "cuda",
    precision: str = "fp16",
    **options,
) -> TensorRTPolicy:
    """Like `factory.load_policy` for the TensorRT back end: checkpoint directory or random
    weights of `preset`, exported to ONNX (cached) and built into plans (cached)."""
    import_tensorrt()  # fail before the export when TensorRT is missing
    loaded = load_checkpoint(checkpoint) if checkpoint else random_checkpoint(preset, seed)
    return TensorRTPolicy.from_checkpoint(
        loaded, device=device, seed=seed, precision=precision, **policy_options(loaded, options)
    )
