"""Every KV-reuse path against full recomputation (model.reference_velocity, no cache)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine.checkpoint import random_checkpoint, save_checkpoint
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.model import text_bias, tokenize
from vla_runtime.engine.policy import Observation, PolicyError
from vla_runtime.engine.torch_backend import TorchPolicy, reference_sample

TOL = 1e-4
SEED = 7


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def checkpoint():
    return random_checkpoint("tiny", seed=3)


def observation(seed: int, instruction="pick up the red block", stamp=0.0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {
        name: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for name in ("scene", "wrist")
    }
    return Observation(images, rng.normal(size=8).astype(np.float32), instruction, stamp)


def reference_chunks(checkpoint, obs: Observation, noise: np.ndarray, steps: int) -> np.ndarray:
    return reference_sample(checkpoint, obs, noise, steps)


def seeded_noise(count=1):
    return np.random.default_rng(SEED).standard_normal((count, 16, 8), dtype=np.float32)


class CallCounter:
    def __init__(self, policy: TorchPolicy, *names: str):
        self.counts = dict.fromkeys(names, 0)
        for name in names:
            original = getattr(policy, name)

            def counted(*args, _name=name, _original=original):
                self.counts[_name] += 1
                return _original(*args)

            setattr(policy, name, counted)


def test_staged_cache_matches_joint_recomputation(checkpoint):
    model, cfg = checkpoint.model, checkpoint.config
    obs = observation(1)
    text = torch.from_numpy(tokenize(obs.instruction, cfg.max_text_len))[None].repeat(2, 1)
    images = torch.stack([torch.from_numpy(obs.images[c]) for c in ("scene", "wrist")])[None]
    images = images.repeat(2, 1, 1, 1, 1)
    state = torch.randn(2, 8)
    actions = torch.randn(2, 16, 8)
    tau = torch.tensor([0.1, 0.8])
    with torch.no_grad():
        kv, bias = model.encode_prefix(text, images, state)
        cached = model.velocity(actions, tau, kv, bias)
        full = model.reference_velocity(text, images, state, actions, tau)
    err = (cached - full).abs().max().item()
    print(f"staged prefix KV vs joint recomputation: max abs err {err:.2e}")
    assert kv.shape[4] == cfg.prefix_len
    assert torch.equal(bias[:, : cfg.max_text_len], text_bias(text))
    assert err < TOL


def test_prefix_kv_shared_by_all_denoising_steps(checkpoint):
    policy = TorchPolicy(checkpoint, seed=SEED)
    obs = observation(2)
    chunk = policy.infer(obs, ComputeMode(0, 0))
    expected = reference_chunks(checkpoint, obs, seeded_noise(), steps=10)[0]
    err = np.abs(chunk.actions - expected).max()
    print(f"prefix KV shared by 10 steps vs per-step recomputation: max abs err {err:.2e}")
    assert err < TOL
    assert chunk.mode == ComputeMode(0, 0)
    assert chunk.info["steps"] == 10
    assert set(chunk.timings_ms) >= {"vision", "backbone", "action_head", "total"}


def test_instruction_kv_computed_once_per_instruction(checkpoint):
    policy = TorchPolicy(checkpoint, seed=SEED)
    counter = CallCounter(policy, "instruction_kv")
    policy.infer(observation(3), ComputeMode(1, 0))
    assert counter.counts["instruction_kv"] == 1
    policy.reseed(SEED)
    obs = observation(4)  # new images and state, same instruction
    chunk = policy.infer(obs, ComputeMode(1, 0))
    assert counter.counts["instruction_kv"] == 1
    assert chunk.mode.vision_level == 1
    err = np.abs(chunk.actions - reference_chunks(checkpoint, obs, seeded_noise(), 10)[0]).max()
    print(f"instruction KV reuse: max abs err {err:.2e}")
    assert err < TOL
    policy.infer(observation(4, instruction="open the drawer"), ComputeMode(1, 0))
    assert counter.counts["instruction_kv"] == 2


def test_stable_camera_kv_reused(checkpoint):
    policy = TorchPolicy(checkpoint, seed=SEED)
    first = observation(5)
    policy.infer(first, ComputeMode(0, 0))
    counter = CallCounter(policy, "vision_tokens")
    second = observation(6)
    second.images["scene"] = first.images["scene"]  # the stable camera did not change
    policy.reseed(SEED)
    chunk = policy.infer(second, ComputeMode(2, 0, frozenset({"scene"})))
    assert counter.counts["vision_tokens"] == 1  # wrist only
    assert chunk.mode.vision_level == 2 and chunk.info["cameras_reused"] == 1
    err = np.abs(chunk.actions - reference_chunks(checkpoint, second, seeded_noise(), 10)[0]).max()
    print(f"stable camera vision KV reuse: max abs err {err:.2e}")
    assert err < TOL

    # marked stable although it moved: the stale KV is used, so the result differs
    third = observation(7)
    third.images["wrist"] = second.images["wrist"]
    policy.reseed(SEED)
    stale = policy.infer(third, ComputeMode(2, 0))
    assert stale.info["cameras_reused"] == 2
    fresh = reference_chunks(checkpoint, third, seeded_noise(), 10)[0]
    assert np.abs(stale.actions - fresh).max() > 1e-3


def test_an_earlier_frame_of_a_stable_camera_is_reused_with_it():
    from vla_runtime.engine.model import default_spec

    spec = default_spec(image_size=64, earlier_frames={"scene": 0.1})
    policy = TorchPolicy(random_checkpoint("tiny", seed=3, spec=spec), seed=SEED)
    rng = np.random.default_rng(0)
    images = {c.name: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for c in spec.cameras}
    policy.infer(Observation(images, np.zeros(8, np.float32), "touch"), ComputeMode(0, 0))
    counter = CallCounter(policy, "vision_tokens")
    chunk = policy.infer(Observation(images, np.zeros(8, np.float32), "touch"),
                         ComputeMode(2, 0, frozenset({"scene"})))  # fmt: skip
    assert counter.counts["vision_tokens"] == 1  # wrist only: scene and its earlier frame kept
    assert chunk.info["cameras_reused"] == 2


def test_levels_3_and_4_reuse_the_prefix(checkpoint):
    policy = TorchPolicy(checkpoint, seed=SEED, max_reuse=2)
    first = observation(8)
    policy.infer(first, ComputeMode(0, 0))
    counter = CallCounter(policy, "vision_tokens", "block_kv")

    moved = Observation(first.images, first.state + 0.5, first.instruction)
    policy.reseed(SEED)
    chunk = policy.infer(moved, ComputeMode(3, 0))
    assert counter.counts == {"vision_tokens": 0, "block_kv": 1}  # the state token only
    assert chunk.mode.vision_level == 3
    assert (
        np.abs(chunk.actions - reference_chunks(checkpoint, moved, seeded_noise(), 10)[0]).max()
        < TOL
    )

    later = observation(9)
    policy.reseed(SEED)
    reused = policy.infer(later, ComputeMode(4, 0))
    assert counter.counts == {"vision_tokens": 0, "block_kv": 1}  # nothing recomputed
    assert reused.mode.vision_level == 4
    # the previous prefix (observation `moved`) is what the chunk was computed from
    assert np.abs(reused.actions - chunk.actions).max() < TOL

    policy.infer(later, ComputeMode(4, 0))  # second reuse: still within max_reuse=2
    refreshed = policy.infer(later, ComputeMode(4, 0))
    assert refreshed.mode.vision_level < 4
    assert counter.counts["block_kv"] >= 2


def test_candidates_share_one_expanded_prefix(checkpoint):
    policy = TorchPolicy(checkpoint, seed=SEED)
    counter = CallCounter(policy, "block_kv", "instruction_kv")
    obs = observation(10)
    chunks = policy.sample_candidates(obs, 4)
    assert chunks.shape == (4, 16, 8)
    assert counter.counts == {"instruction_kv": 1, "block_kv": 3}  # 2 cameras + state, once
    expected = reference_chunks(checkpoint, obs, seeded_noise(4), 10)
    err = np.abs(chunks - expected).max()
    print(f"4 candidates from one expanded prefix KV: max abs err {err:.2e}")
    assert err < TOL
    assert np.abs(chunks[0] - chunks[1]).max() > 1e-3  # different noise, different chunks


def test_denoise_levels(checkpoint):
    policy = TorchPolicy(checkpoint, seed=SEED, warm_steps=1, warm_start_tau=0.99)
    obs = observation(11, stamp=10.0)
    half = policy.infer(obs, ComputeMode(0, 1))
    assert half.mode.denoise_level == 1 and half.info["steps"] == 5

    fresh = TorchPolicy(checkpoint, seed=SEED)
    assert fresh.infer(obs, ComputeMode(0, 2)).mode.denoise_level == 1  # nothing to warm-start

    # 3 steps (0.15 s at dt 0.05) later the warm start begins from the shifted previous chunk
    later = Observation(obs.images, obs.state, obs.instruction, stamp=10.15)
    warm = policy.infer(later, ComputeMode(0, 2))
    assert warm.mode.denoise_level == 2 and warm.info["steps"] == 1
    shifted = np.concatenate([half.actions[3:], np.repeat(half.actions[-1:], 3, axis=0)])
    assert np.abs(warm.actions - shifted).max() < 0.1
    assert np.abs(warm.actions - shifted).max() < np.abs(warm.actions - half.actions).max()


def test_noise_scale_scales_the_flow_start(checkpoint):
    """noise_scale 0 samples from the mean start: repeatable chunks, equal to the reference
    sampler fed zero noise; a fraction scales the seeded noise exactly."""
    obs = observation(12)
    deterministic = TorchPolicy(checkpoint, seed=SEED, noise_scale=0.0)
    first, second = deterministic.infer(obs).actions, deterministic.infer(obs).actions
    assert np.array_equal(first, second)
    zero = np.zeros((1, 16, 8), np.float32)
    assert np.abs(first - reference_chunks(checkpoint, obs, zero, 10)[0]).max() < TOL
    half = TorchPolicy(checkpoint, seed=SEED, noise_scale=0.5).infer(obs).actions
    expected = reference_chunks(checkpoint, obs, 0.5 * seeded_noise(), 10)[0]
    assert np.abs(half - expected).max() < TOL
    with pytest.raises(PolicyError, match="noise_scale"):
        TorchPolicy(checkpoint, noise_scale=1.5)
    # One inference may ask for other noise (a retry after a refused chunk): the seeded noise,
    # scaled; the next one is deterministic again.
    retry = TorchPolicy(checkpoint, seed=SEED, noise_scale=0.0)
    resampled = retry.infer(obs, noise_scale=0.5)
    assert np.abs(resampled.actions - half).max() < TOL and resampled.info["noise_scale"] == 0.5
    assert np.abs(retry.infer(obs).actions - first).max() < TOL
    with pytest.raises(PolicyError, match="noise_scale"):
        retry.infer(obs, noise_scale=-0.1)


def test_checkpoint_recommends_its_noise_scale(checkpoint, tmp_path):
    """A checkpoint measured with deterministic sampling says so in spec.json: loading it
    samples deterministically unless the caller asks otherwise; unknown options are refused."""
    directory = save_checkpoint(
        tmp_path / "ckpt", replace(checkpoint, inference={"noise_scale": 0.0})
    )
    obs = observation(12)
    recommended = load_policy("torch", str(directory), seed=SEED)
    assert recommended.noise_scale == 0.0
    assert np.array_equal(recommended.infer(obs).actions, recommended.infer(obs).actions)
    assert load_policy("torch", str(directory), seed=SEED, noise_scale=None).noise_scale == 0.0
    overridden = load_policy("torch", str(directory), seed=SEED, noise_scale=1.0)
    expected = TorchPolicy(checkpoint, seed=SEED).infer(obs).actions
    assert np.abs(overridden.infer(obs).actions - expected).max() < TOL
    meta = json.loads((directory / "spec.json").read_text())
    (directory / "spec.json").write_text(json.dumps({**meta, "inference": {"noise": 0.0}}))
    with pytest.raises(PolicyError, match="unknown inference options"):
        load_policy("torch", str(directory))


def test_warm_start_rebases_joint_deltas_on_the_new_state():
    """A joint-delta chunk is relative to the state it came from: after the arm moved, the warm
    start (and the divergence signal) must use the same absolute plan, not the same deltas."""
    from dataclasses import replace

    from vla_runtime.engine.checkpoint import Checkpoint, Normalization
    from vla_runtime.engine.policy import ActionSpace, chunk_to_positions

    base = random_checkpoint("tiny", seed=3)
    spec = replace(base.spec, action_space=ActionSpace.JOINT_DELTAS)
    norm = Normalization(np.zeros(8), np.ones(8), np.zeros(8), np.full(8, 0.1))
    policy = TorchPolicy(Checkpoint(base.model, spec, norm), seed=SEED, warm_steps=1,
                         warm_start_tau=0.999)  # fmt: skip
    obs = observation(13, stamp=5.0)
    first = policy.infer(obs)
    moved_state = obs.state.copy()
    moved_state[:7] += 0.05  # the arm moved; no time passed (shift 0)
    moved = Observation(obs.images, moved_state, obs.instruction, stamp=5.0)
    warm = policy.infer(moved, ComputeMode(0, 2))
    assert warm.mode.denoise_level == 2
    same_plan = chunk_to_positions(warm.actions, moved_state, spec)
    assert np.abs(same_plan - chunk_to_positions(first.actions, obs.state, spec)).max() < 2e-3
    assert warm.info["chunk_divergence"] < 0.02  # normalised units: the plan did not change
