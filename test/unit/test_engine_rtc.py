"""Real-time-chunking guidance: mask, schedule, VJP, and that the frozen prefix follows the plan."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine import rtc
from vla_runtime.engine.checkpoint import random_checkpoint
from vla_runtime.engine.onnx_backend import MANIFEST, OrtPolicy, export_onnx
from vla_runtime.engine.policy import Observation
from vla_runtime.engine.torch_backend import TorchPolicy

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def checkpoint():
    return random_checkpoint("tiny", seed=21)


def observation(seed: int) -> Observation:
    rng = np.random.default_rng(seed)
    images = {n: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for n in ("scene", "wrist")}
    return Observation(images, rng.normal(size=8).astype(np.float32), "wipe the table")


def test_soft_mask_follows_the_paper():
    w = rtc.soft_mask(16, delay=4, execution_horizon=8)
    expected = [1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2] + [0] * 8
    assert torch.allclose(w, torch.tensor(expected, dtype=torch.float32), atol=1e-6)
    assert rtc.soft_mask(16, 12, 12)[:12].eq(1).all() and rtc.soft_mask(16, 12, 12)[12:].eq(0).all()


def test_guidance_steers_only_the_actions_of_the_plan():
    """The plan ends where the new chunk takes over: no ramp pulls the next actions toward the
    plan's last one held."""
    guidance = rtc.make_guidance(torch.zeros(4, 8), 16)
    assert guidance.weights[:4].eq(1).all() and guidance.weights[4:].eq(0).all()
    late = rtc.make_guidance(torch.zeros(12, 8), 16)  # d > H - d
    assert late.weights[:12].eq(1).all() and late.weights[12:].eq(0).all()
    ramp = rtc.make_guidance(torch.zeros(4, 8), 16, execution_horizon=8)  # the paper's, on request
    assert torch.equal(ramp.weights, rtc.soft_mask(16, 4, 8))


def test_guidance_weight_schedule():
    assert rtc.guidance_weight(0.5, 10.0) == pytest.approx(2.0)
    assert rtc.guidance_weight(0.9, 10.0) == pytest.approx(0.82 / 0.09)
    assert rtc.guidance_weight(0.0, 10.0) == 10.0
    assert rtc.guidance_weight(0.99, 10.0) == 10.0


def test_guided_step_uses_the_vector_jacobian_product():
    torch.manual_seed(0)
    mixing = torch.randn(3, 3)
    a0 = torch.randn(1, 4, 3)
    plan = torch.randn(2, 3)
    guidance = rtc.make_guidance(plan, horizon=4)

    def velocity(a, tau):
        return a @ mixing

    # one step from tau 0: dtau = 1, beta = beta_max = 1
    out = rtc.denoise(velocity, a0, 0.0, 1, guidance, rtc.autograd_step(velocity))
    jacobian = torch.eye(3) + mixing  # d(a + v)/da, applied on the right
    error = guidance.weights[None, :, None] * (guidance.target - a0 @ jacobian)
    expected = a0 + a0 @ mixing + error @ jacobian.T
    assert torch.allclose(out, expected, atol=1e-5)
    approx = rtc.denoise(velocity, a0, 0.0, 1, guidance, rtc.identity_step(velocity))
    assert torch.allclose(approx, a0 + a0 @ mixing + error, atol=1e-5)


def _plan(policy, obs, delay=5) -> np.ndarray:
    """A plausible plan: another sample from the same policy, offset so it truly differs."""
    policy.reseed(99)
    return policy.infer(obs).actions[:delay] + 0.3


@pytest.mark.parametrize("mode", [ComputeMode(0, 0), ComputeMode(0, 1)])
def test_torch_guidance_makes_the_prefix_follow_the_plan(checkpoint, mode):
    policy = TorchPolicy(checkpoint)
    obs = observation(1)
    plan = _plan(policy, obs)
    policy.reseed(5)
    free = policy.infer(obs, mode).actions
    free_err = float(np.abs(free[:5] - plan).max())
    policy.reseed(5)
    guided = policy.infer(obs, mode, plan=plan)
    guided_err = guided.info["rtc_prefix_err"]
    print(f"{mode.token}: prefix err unguided {free_err:.3f}, guided {guided_err:.3f}")
    assert guided.info["rtc_prefix_err"] < 0.25 * free_err
    assert guided.info["rtc_delay"] == 5 and guided.info["rtc_exact_vjp"] == 1.0
    assert "rtc_boundary_jump" in guided.info
    assert np.abs(guided.actions[:5] - plan).max() == pytest.approx(guided.info["rtc_prefix_err"])
    # beyond the plan the mask is zero: guidance must not pin the tail to its last action
    assert np.abs(guided.actions[5:] - plan[-1]).max() > guided.info["rtc_prefix_err"]


def test_candidate_closest_to_the_plan_is_chosen(checkpoint):
    policy = TorchPolicy(checkpoint, candidates=4)
    obs = observation(2)
    plan = _plan(policy, obs, delay=3)
    policy.reseed(8)
    chunk = policy.infer(obs, plan=plan)
    policy.reseed(8)
    candidates = policy.sample_candidates(obs, 4, plan=plan)
    weights = rtc.soft_mask(16, 3, 13).numpy()[:, None]
    target = np.concatenate([plan, np.repeat(plan[-1:], 13, axis=0)])
    costs = [(weights * np.abs(c - target)).sum() for c in candidates]
    assert np.allclose(chunk.actions, candidates[int(np.argmin(costs))], atol=1e-5)
    assert chunk.info["candidates"] == 4


def test_ort_guidance_is_the_exact_product(checkpoint, tmp_path):
    """The exported expert_guided graph steers like torch.autograd: the same guided chunk."""
    ort_policy = OrtPolicy.from_checkpoint(checkpoint, cache_dir=tmp_path, threads=1)
    torch_policy = TorchPolicy(checkpoint)
    obs = observation(3)
    plan = _plan(torch_policy, obs)
    chunks = []
    for policy in (torch_policy, ort_policy):
        policy.reseed(5)
        chunks.append(policy.infer(obs, plan=plan))
    print(f"prefix err torch {chunks[0].info['rtc_prefix_err']:.4f}, "
          f"ORT {chunks[1].info['rtc_prefix_err']:.4f}")  # fmt: skip
    assert chunks[1].info["rtc_exact_vjp"] == 1.0
    assert np.abs(chunks[0].actions - chunks[1].actions).max() < 1e-3


def test_ort_export_without_the_guided_graph_uses_the_identity(checkpoint, tmp_path):
    directory = export_onnx(checkpoint, tmp_path)
    manifest = json.loads((directory / MANIFEST).read_text())
    del manifest["files"]["expert_guided"]
    (directory / MANIFEST).write_text(json.dumps(manifest))
    policy = OrtPolicy(directory, threads=1)
    obs = observation(3)
    plan = _plan(policy, obs)
    policy.reseed(5)
    free_err = float(np.abs(policy.infer(obs).actions[:5] - plan).max())
    policy.reseed(5)
    guided = policy.infer(obs, plan=plan)
    print(f"ORT: prefix err unguided {free_err:.3f}, guided {guided.info['rtc_prefix_err']:.3f}")
    assert guided.info["rtc_exact_vjp"] == 0.0
    assert guided.info["rtc_prefix_err"] < 0.25 * free_err
    # export_onnx treats that directory as an older export and writes it again, complete
    assert export_onnx(checkpoint, tmp_path) == directory
    assert "expert_guided" in json.loads((directory / MANIFEST).read_text())["files"]
