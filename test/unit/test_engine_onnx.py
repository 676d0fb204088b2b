"""ONNX export and the ONNX Runtime back end against the torch reference."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine.checkpoint import random_checkpoint
from vla_runtime.engine.model import text_bias, tokenize
from vla_runtime.engine.onnx_backend import FILES, MANIFEST, OrtPolicy, export_onnx
from vla_runtime.engine.policy import Observation, Policy
from vla_runtime.engine.torch_backend import TorchPolicy

TOL = 1e-3


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def checkpoint():
    return random_checkpoint("tiny", seed=5)


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    return export_onnx(checkpoint, tmp_path_factory.mktemp("engines"))


def observation(seed: int, stamp: float = 0.0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {n: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for n in ("scene", "wrist")}
    return Observation(images, rng.normal(size=8).astype(np.float32), "stack the cups", stamp)


def test_export_writes_documented_graphs(exported, checkpoint):
    manifest = json.loads((exported / MANIFEST).read_text())
    assert exported.name.startswith("onnx-")
    for name in FILES:
        graph = onnx.load(str(exported / f"{name}.onnx"), load_external_data=False).graph
        io = manifest["io"][name]
        assert [i.name for i in graph.input] == list(io["inputs"])
        assert [o.name for o in graph.output] == list(io["outputs"])
    kv_shape = manifest["io"]["expert_step"]["inputs"]["prefix_kv"]
    cfg = checkpoint.config
    assert kv_shape == [cfg.layers, 2, "B", cfg.heads, cfg.prefix_len, cfg.head_dim]


def test_export_is_cached_by_model_hash(exported, checkpoint):
    stamp = (exported / "expert_step.onnx").stat().st_mtime_ns
    assert export_onnx(checkpoint, exported.parent) == exported
    assert (exported / "expert_step.onnx").stat().st_mtime_ns == stamp
    other = random_checkpoint("tiny", seed=6)
    assert export_onnx(other, exported.parent) != exported


def test_stages_match_torch_with_dynamic_batch(exported, checkpoint):
    ort_policy = OrtPolicy(exported, threads=1)
    model, cfg = checkpoint.model, checkpoint.config
    text = torch.from_numpy(tokenize("stack the cups", cfg.max_text_len))[None].repeat(2, 1)
    images = torch.randint(0, 256, (2, 224, 224, 3), dtype=torch.uint8)
    index = torch.tensor([0, 1])
    with torch.no_grad():
        pairs = {}
        text_kv = model.instruction_kv(text)
        pairs["instruction"] = (ort_policy.instruction_kv(text), text_kv)
        tokens = model.vision_tokens(images, index)
        pairs["vision"] = (ort_policy.vision_tokens(images, index), tokens)
        bias = text_bias(text)
        block = model.block_kv(tokens, text_kv, bias)
        pairs["prefix_block"] = (ort_policy.block_kv(tokens, text_kv, bias), block)
        past = torch.cat([text_kv, block], dim=4)
        past_bias = torch.nn.functional.pad(bias, (0, block.shape[4]))
        state = model.state_tokens(torch.randn(2, 8))
        pairs["state_block"] = (
            ort_policy.block_kv(state, past, past_bias),
            model.block_kv(state, past, past_bias),
        )
    for name, (ort_out, torch_out) in pairs.items():
        err = (ort_out - torch_out).abs().max().item()
        print(f"{name}: ORT vs torch max abs err {err:.2e}")
        assert ort_out.shape == torch_out.shape
        assert err < TOL


def test_ort_policy_matches_torch_in_every_mode(exported, checkpoint):
    ort_policy = OrtPolicy(exported, seed=11, threads=1)
    torch_policy = TorchPolicy(checkpoint, seed=11)
    assert isinstance(ort_policy, Policy)
    assert ort_policy.spec == checkpoint.spec
    stable = ComputeMode(2, 0, frozenset({"scene"}))
    sequence = [
        (observation(1, 0.0), ComputeMode(0, 0)),
        (observation(2, 0.1), ComputeMode(1, 1)),
        (observation(2, 0.2), stable),
        (observation(3, 0.3), ComputeMode(3, 2)),
        (observation(4, 0.4), ComputeMode(4, 0)),
    ]
    worst = 0.0
    for obs, mode in sequence:
        a = ort_policy.infer(obs, mode)
        b = torch_policy.infer(obs, mode)
        assert a.mode == b.mode
        worst = max(worst, float(np.abs(a.actions - b.actions).max()))
    print(f"ORT vs torch over v0d0 v1d1 v2d0 v3d2 v4d0: max abs err {worst:.2e}")
    assert worst < TOL
    assert b.mode.vision_level == 4

    obs = observation(5)
    ort_policy.reseed(3)
    torch_policy.reseed(3)
    candidates = ort_policy.sample_candidates(obs, 3)
    assert candidates.shape == (3, 16, 8)
    assert np.abs(candidates - torch_policy.sample_candidates(obs, 3)).max() < TOL
