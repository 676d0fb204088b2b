"""ONNX export of the reference model's stages, and the ONNX Runtime back end.

`export_onnx(checkpoint)` writes `<cache>/onnx-<model hash>/` (cache: `engine_cache_root()`)
once per model; a TensorRT back end builds its plans from the same files. All tensors float32
unless noted; opset 17; B is dynamic everywhere.

instruction.onnx   in:  text_ids int64 [B, Lt]
                   out: text_kv [L, 2, B, nh, Lt, hd]
vision.onnx        in:  image uint8 [B, Hi, Wi, 3] (rgb8), camera_index int64 [B]
                   out: vision_tokens [B, Nv, D]
prefix_block.onnx  in:  tokens [B, T, D], past_kv [L, 2, B, nh, Tp, hd], past_bias [B, Tp]
                   out: block_kv [L, 2, B, nh, T, hd]
state_embed.onnx   in:  state [B, S] (normalised)
                   out: state_tokens [B, 1, D]
expert_step.onnx   in:  noisy_actions [B, H, A], tau [B], prefix_kv [L, 2, B, nh, P, hd],
                        prefix_bias [B, P]
                   out: velocity [B, H, A]
expert_guided.onnx in:  noisy_actions [1, H, A], tau [1], prefix_kv [L, 2, 1, nh, P, hd],
                        prefix_bias [1, P], target [1, H, A], weights [1, H, 1]
                   out: velocity [1, H, A], guidance [1, H, A]

KV index 1 is 0 = keys, 1 = values. Lt = max_text_len (BOS + UTF-8 bytes, PAD = 257), Nv =
tokens per camera, P = Lt + C*Nv + 1. prefix_block has two more dynamic axes: T (Nv for a
camera block, 1 for the state token) and Tp (Lt for a camera block, Lt + C*Nv for the state).
past_bias / prefix_bias are additive key biases: 0, or -1e4 on instruction padding.
`manifest.json` repeats these shapes with the numbers filled in, plus spec, model config and
normalisation, so a back end can run from the directory alone.

One inference = instruction (cached per instruction) -> per camera vision + prefix_block
(past = text KV) -> state_embed + prefix_block (past = text + cameras) -> N x expert_step,
with A <- A + velocity / N from Gaussian noise at tau = 0.

expert_guided is one real-time-chunking step (engine/rtc.py): the velocity and g = J^T e, e =
W (Y - A1), A1 = A + (1 - tau) v, through the action expert's exact vector-Jacobian product.
ONNX Runtime has no autograd, so the product is traced once (torch.func.vjp under make_fx,
decomposed into core ATen ops) and exported as a plain graph; batch 1 (one call per candidate).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn
from torch._decomp import core_aten_decompositions, get_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from vla_runtime.engine import rtc
from vla_runtime.engine.checkpoint import Checkpoint, Normalization, model_hash
from vla_runtime.engine.kv_cache import CachedPolicy
from vla_runtime.engine.model import ModelConfig, VLAModel
from vla_runtime.engine.policy import PolicySpec

OPSET = 17
MANIFEST = "manifest.json"
FILES = ("instruction", "vision", "prefix_block", "state_embed", "expert_step", "expert_guided")
FORMAT = 2  # manifests of another format (an older export) are exported again


def engine_cache_root() -> Path:
    """$VLA_RUNTIME_ENGINES; else engines/cache/ of a source checkout (git-ignored,
    engines/README.md); else ~/.cache/vla_runtime/engines (an installed package)."""
    if os.environ.get("VLA_RUNTIME_ENGINES"):
        return Path(os.environ["VLA_RUNTIME_ENGINES"])
    repo = Path(__file__).resolve().parents[2]
    if (repo / "engines").is_dir():
        return repo / "engines" / "cache"
    return Path.home() / ".cache" / "vla_runtime" / "engines"


class _Stage(nn.Module):
    def __init__(self, model: VLAModel, method: str):
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, *args):
        return getattr(self.model, self.method)(*args)


def _io_table(cfg: ModelConfig, spec: PolicySpec) -> dict:
    """Names and shapes of every graph's inputs/outputs (strings = dynamic axes)."""
    kv = lambda t: [cfg.layers, 2, "B", cfg.heads, t, cfg.head_dim]  # noqa: E731
    lt, nv, p, d = cfg.max_text_len, cfg.tokens_per_camera, cfg.prefix_len, cfg.dim
    h, a = cfg.chunk_len, cfg.action_dim
    return {
        "instruction": {"inputs": {"text_ids": ["B", lt]}, "outputs": {"text_kv": kv(lt)}},
        "vision": {
            "inputs": {
                "image": ["B", cfg.image_height, cfg.image_width, 3],
                "camera_index": ["B"],
            },
            "outputs": {"vision_tokens": ["B", nv, d]},
        },
        "prefix_block": {
            "inputs": {"tokens": ["B", "T", d], "past_kv": kv("Tp"), "past_bias": ["B", "Tp"]},
            "outputs": {"block_kv": kv("T")},
        },
        "state_embed": {
            "inputs": {"state": ["B", cfg.state_dim]},
            "outputs": {"state_tokens": ["B", 1, d]},
        },
        "expert_step": {
            "inputs": {
                "noisy_actions": ["B", h, a],
                "tau": ["B"],
                "prefix_kv": kv(p),
                "prefix_bias": ["B", p],
            },
            "outputs": {"velocity": ["B", h, a]},
        },
        "expert_guided": {
            "inputs": {
                "noisy_actions": [1, h, a],
                "tau": [1],
                "prefix_kv": [cfg.layers, 2, 1, cfg.heads, p, cfg.head_dim],
                "prefix_bias": [1, p],
                "target": [1, h, a],
                "weights": [1, h, 1],
            },
            "outputs": {"velocity": [1, h, a], "guidance": [1, h, a]},
        },
    }


def _example_inputs(cfg: ModelConfig) -> dict[str, tuple]:
    lt, nv, p = cfg.max_text_len, cfg.tokens_per_camera, cfg.prefix_len

    def kv(t):
        return torch.zeros(cfg.layers, 2, 1, cfg.heads, t, cfg.head_dim)

    text = torch.full((1, lt), 257, dtype=torch.long)
    text[0, :4] = torch.tensor([256, 104, 105, 33])
    return {
        "instruction": (text,),
        "vision": (
            torch.zeros(1, cfg.image_height, cfg.image_width, 3, dtype=torch.uint8),
            torch.zeros(1, dtype=torch.long),
        ),
        "prefix_block": (torch.zeros(1, nv, cfg.dim), kv(lt), torch.zeros(1, lt)),
        "state_embed": (torch.zeros(1, cfg.state_dim),),
        "expert_step": (
            torch.zeros(1, cfg.chunk_len, cfg.action_dim),
            torch.zeros(1),
            kv(p),
            torch.zeros(1, p),
        ),
        "expert_guided": (
            torch.zeros(1, cfg.chunk_len, cfg.action_dim),
            torch.full((1,), 0.5),
            kv(p),
            torch.zeros(1, p),
            torch.zeros(1, cfg.chunk_len, cfg.action_dim),
            torch.ones(1, cfg.chunk_len, 1),
        ),
    }


_METHODS = {
    "instruction": "instruction_kv",
    "vision": "vision_tokens",
    "prefix_block": "block_kv",
    "state_embed": "state_tokens",
    "expert_step": "velocity",
}


# Core ATen ops the TorchScript-based exporter has no symbolic for, decomposed further.
_EXPORT_DECOMPOSED = [torch.ops.aten._softmax, torch.ops.aten.native_layer_norm]


def guided_step_graph(model: VLAModel, examples: tuple) -> torch.fx.GraphModule:
    """expert_guided as an FX graph of core ATen ops (forward and backward of the expert), which
    the TorchScript-based exporter can write like any other graph."""

    def step(actions, tau, prefix_kv, prefix_bias, target, weights):
        v, pullback = torch.func.vjp(
            lambda a: model.velocity(a, tau, prefix_kv, prefix_bias), actions
        )
        keep = (1.0 - tau)[:, None, None]
        error = weights * (target - (actions + keep * v))
        (jt_error,) = pullback(error)
        return v, error + keep * jt_error

    table = {**core_aten_decompositions(), **get_decompositions(_EXPORT_DECOMPOSED)}
    with sdpa_kernel(SDPBackend.MATH):  # attention as matmuls and softmax, backward included
        return make_fx(step, decomposition_table=table)(*examples)


def export_onnx(checkpoint: Checkpoint, cache_dir: str | Path | None = None) -> Path:
    """Export every stage (once per model hash) and return the directory."""
    root = Path(cache_dir) if cache_dir is not None else engine_cache_root()
    target = root / f"onnx-{model_hash(checkpoint)}"
    if _complete(target):
        return target
    cfg, spec = checkpoint.config, checkpoint.spec
    model = checkpoint.model
    if next(model.parameters()).device.type != "cpu":
        model = copy.deepcopy(model).cpu()  # leave the caller's (GPU) model where it is
    model.eval()
    table = _io_table(cfg, spec)
    examples = _example_inputs(cfg)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=root))
    try:
        for name in FILES:
            io = table[name]
            dynamic = {
                tensor: {i: axis for i, axis in enumerate(shape) if isinstance(axis, str)}
                for tensor, shape in {**io["inputs"], **io["outputs"]}.items()
            }
            if name == "expert_guided":
                module = guided_step_graph(model, examples[name])
            else:
                module = _Stage(model, _METHODS[name])
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # legacy-exporter deprecation and tracer notes
                torch.onnx.export(
                    module,
                    examples[name],
                    str(staging / f"{name}.onnx"),
                    input_names=list(io["inputs"]),
                    output_names=list(io["outputs"]),
                    dynamic_axes=dynamic,
                    opset_version=OPSET,
                    dynamo=False,
                )
        manifest = {
            "format": FORMAT,
            "opset": OPSET,
            "files": {name: f"{name}.onnx" for name in FILES},
            "io": table,
            "spec": spec.to_dict(),
            "model": cfg.to_dict(),
            "normalization": checkpoint.normalization.to_dict(),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if target.exists() and not _complete(target):
            shutil.rmtree(target, ignore_errors=True)  # an older format's export
        try:
            staging.rename(target)
        except OSError:  # another process exported the same model meanwhile
            if not _complete(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _complete(directory: Path) -> bool:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("format") == FORMAT and set(manifest.get("files", {})) == set(FILES)


def default_providers(device: str) -> list:
    """CUDA execution provider (with its device id) when asked for and installed, else CPU.
    ORT's TensorRT provider is opt-in (`providers=[...]`): its first run builds engines for
    minutes, and `tensorrt_backend` already builds cached plans from these files."""

    providers: list = []
    if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        device_id = int(device.split(":")[1]) if ":" in device else 0
        providers.append(("CUDAExecutionProvider", {"device_id": device_id}))
    return providers + ["CPUExecutionProvider"]


class OrtPolicy(CachedPolicy):
    """The exported stages run by ONNX Runtime, with the same caches and compute modes as the
    torch back end; RTC guidance runs the exported exact vector-Jacobian product
    (expert_guided), or approximates the Jacobian by the identity for a directory exported
    without it (`ActionChunk.info["rtc_exact_vjp"]` says which)."""

    def __init__(
        self,
        directory: str | Path,
        device: str = "cpu",
        seed: int = 0,
        providers: list[str] | None = None,
        threads: int | None = None,
        **options,
    ):

        self.directory = Path(directory)
        manifest = json.loads((self.directory / MANIFEST).read_text())
        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            session_options.intra_op_num_threads = threads
        self.providers = providers or default_providers(device)
        self.sessions = {
            name: ort.InferenceSession(
                str(self.directory / file), session_options, providers=self.providers
            )
            for name, file in manifest["files"].items()
        }
        self.exact_guidance = "expert_guided" in self.sessions
        super().__init__(
            PolicySpec.from_dict(manifest["spec"]),
            ModelConfig(**manifest["model"]),
            Normalization.from_dict(manifest["normalization"]),
            "cpu",  # host-side tensors; ORT moves data to its execution provider
            seed,
            **options,
        )

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, cache_dir=None, **kwargs) -> OrtPolicy:
        return cls(export_onnx(checkpoint, cache_dir), **kwargs)

    def _run(self, name: str, **inputs) -> torch.Tensor:
        return self._run_many(name, **inputs)[0]

    def _run_many(self, name: str, **inputs) -> list[torch.Tensor]:
        feeds = {k: np.ascontiguousarray(v.numpy()) for k, v in inputs.items()}
        return [torch.from_numpy(out) for out in self.sessions[name].run(None, feeds)]

    def instruction_kv(self, text_ids):
        return self._run("instruction", text_ids=text_ids)

    def vision_tokens(self, image, camera_index):
        return self._run("vision", image=image, camera_index=camera_index)

    def block_kv(self, tokens, past_kv, past_bias):
        return self._run("prefix_block", tokens=tokens, past_kv=past_kv, past_bias=past_bias)

    def state_tokens(self, state):
        return self._run("state_embed", state=state)

    def velocity(self, actions, tau, prefix_kv, prefix_bias):
        return self._run(
            "expert_step",
            noisy_actions=actions,
            tau=tau,
            prefix_kv=prefix_kv,
            prefix_bias=prefix_bias,
        )

    def guided_step(self, velocity, prefix_kv, prefix_bias):
        if not self.exact_guidance:
            return rtc.identity_step(velocity)

        def step(a, tau, target, weights):
            rows = [
                self._run_many(
                    "expert_guided",
                    noisy_actions=a[b : b + 1],
                    tau=torch.full((1,), tau),
                    prefix_kv=prefix_kv[:, :, b : b + 1],
                    prefix_bias=prefix_bias[b : b + 1],
                    target=target[min(b, len(target) - 1)][None],
                    weights=weights,
                )
                for b in range(len(a))  # the graph has batch 1: one call per candidate
            ]
            return tuple(torch.cat([row[i] for row in rows]) for i in range(2))

        return step

    def expand_prefix(self, kv: torch.Tensor, count: int) -> torch.Tensor:
        # ORT needs contiguous buffers: materialise the shared prefix once per call, not per step
        return kv.expand(-1, -1, count, -1, -1, -1).contiguous()
