"""Reference model, presets, checkpoints, normalisation, factory and input validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vla_runtime.core.compute_mode import ComputeMode, ComputeModeError
from vla_runtime.engine.checkpoint import (
    Checkpoint,
    Normalization,
    load_checkpoint,
    model_hash,
    random_checkpoint,
    save_checkpoint,
)
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.model import (
    BOS,
    PAD,
    VLAModel,
    count_parameters,
    default_spec,
    flow_matching_loss,
    preset_config,
    tokenize,
)
from vla_runtime.engine.policy import ActionChunk, Observation, Policy, PolicyError
from vla_runtime.engine.torch_backend import TorchPolicy

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def checkpoint():
    return random_checkpoint("tiny", seed=1)


def observation(seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {n: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for n in ("scene", "wrist")}
    return Observation(images, rng.normal(size=8).astype(np.float32), "push the button", 1.5)


def test_presets():
    spec = default_spec()
    tiny = VLAModel(preset_config("tiny", spec))
    assert count_parameters(tiny) < 5_000_000
    with torch.device("meta"):  # count without allocating 1.8 GB
        small = VLAModel(preset_config("small", spec))
    assert 400e6 <= count_parameters(small) <= 500e6
    with pytest.raises(PolicyError, match="unknown preset"):
        preset_config("huge", spec)


def test_tokenize_is_byte_level():
    ids = tokenize("hé", 8)
    assert ids.tolist() == [BOS, ord("h"), 0xC3, 0xA9, PAD, PAD, PAD, PAD]
    with pytest.raises(PolicyError, match="at most 7"):
        tokenize("x" * 8, 8)


def test_infer_returns_a_chunk_with_mode_and_timings(checkpoint):
    policy = load_policy("torch", preset="tiny", seed=1)
    assert isinstance(policy, Policy)
    chunk = policy.infer(observation(), "v0d0")
    assert isinstance(chunk, ActionChunk)
    assert chunk.actions.shape == (16, 8) and chunk.actions.dtype == np.float32
    assert chunk.stamp == 1.5
    assert chunk.mode == ComputeMode(0, 0)
    assert all(chunk.timings_ms[k] > 0 for k in ("vision", "backbone", "action_head", "total"))
    # same seed, same weights: the factory is deterministic
    again = load_policy("torch", preset="tiny", seed=1).infer(observation(), "v0d0")
    assert np.array_equal(chunk.actions, again.actions)


def test_checkpoint_round_trip(checkpoint, tmp_path):
    stats = Normalization(
        state_mean=np.linspace(-1, 1, 8),
        state_std=np.full(8, 2.0),
        action_mean=np.arange(8) * 0.1,
        action_std=np.full(8, 0.5),
    )
    original = Checkpoint(checkpoint.model, checkpoint.spec, stats)
    save_checkpoint(tmp_path / "ckpt", original)
    meta = json.loads((tmp_path / "ckpt" / "spec.json").read_text())
    assert set(meta) == {"format", "spec", "model", "normalization"}
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.spec == original.spec and loaded.config == original.config
    assert model_hash(loaded) == model_hash(original)
    assert model_hash(loaded) != model_hash(checkpoint)  # stats are part of the identity
    a = TorchPolicy(original, seed=4).infer(observation())
    b = load_policy("torch", checkpoint=str(tmp_path / "ckpt"), seed=4).infer(observation())
    assert np.array_equal(a.actions, b.actions)
    with pytest.raises(PolicyError, match="not a checkpoint"):
        load_checkpoint(tmp_path)


def test_normalisation_is_applied(checkpoint):
    stats = Normalization(
        state_mean=np.full(8, 0.5),
        state_std=np.full(8, 2.0),
        action_mean=np.full(8, 1.0),
        action_std=np.full(8, 3.0),
    )
    obs = observation()
    raw = TorchPolicy(checkpoint, seed=2)
    scaled = TorchPolicy(Checkpoint(checkpoint.model, checkpoint.spec, stats), seed=2)
    normalised_obs = Observation(obs.images, (obs.state - 0.5) / 2.0, obs.instruction)
    expected = raw.infer(normalised_obs).actions * 3.0 + 1.0
    assert np.allclose(scaled.infer(obs).actions, expected, atol=1e-5)


def test_flow_matching_loss_decreases(checkpoint):
    spec = default_spec()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VLAModel(preset_config("tiny", spec))
        generator = torch.Generator().manual_seed(0)
        text = torch.from_numpy(tokenize("push the button", model.cfg.max_text_len))[None].repeat(
            2, 1
        )
        images = torch.randint(0, 256, (2, 2, 224, 224, 3), dtype=torch.uint8)
        state = torch.randn(2, 8)
        actions = torch.linspace(-1, 1, 16)[None, :, None].repeat(2, 1, 8)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(12):
            generator.manual_seed(0)  # the same noise and tau each step: a clean descent check
            loss = flow_matching_loss(model, text, images, state, actions, generator)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_batched_instructions_share_one_kv_per_distinct_instruction():
    """encode_prefix computes the instruction KV once per distinct instruction and gathers it:
    the same numbers as computing every row."""
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = VLAModel(preset_config("tiny", default_spec(image_size=64))).eval()
    lt = model.cfg.max_text_len
    text = torch.from_numpy(
        np.stack([tokenize(t, lt) for t in ("touch the red cube", "pick it", "touch the red cube")])
    )
    with torch.no_grad():
        kv, _ = model.encode_prefix(
            text, torch.zeros(3, 2, 64, 64, 3, dtype=torch.uint8), torch.zeros(3, 8)
        )
        rows = model.instruction_kv(text)
    assert torch.allclose(kv[..., :lt, :], rows, atol=1e-6)


def test_conv_stem_and_auxiliary_head():
    spec = default_spec(image_size=64)
    config = preset_config("tiny", spec)
    assert config.stem == "conv" and preset_config("small", spec).stem == "patch"
    with pytest.raises(ValueError, match="stem"):
        type(config)(**{**config.to_dict(), "stem": "resnet"})
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VLAModel(type(config)(**{**config.to_dict(), "aux_dim": 3}))
    text = torch.from_numpy(tokenize("touch the red cube", config.max_text_len))[None].repeat(4, 1)
    images = torch.randint(0, 256, (4, 2, 64, 64, 3), dtype=torch.uint8)
    state, actions = torch.randn(4, 8), torch.randn(4, 16, 8)
    target = torch.randn(4, 3)
    flow, aux = flow_matching_loss(model, text, images, state, actions, aux_target=target)
    assert torch.isfinite(flow) and torch.isfinite(aux) and aux.item() > 0
    (flow + aux).backward()  # the auxiliary loss reaches the vision encoder's stem
    assert model.vision.stem[0].weight.grad.abs().sum() > 0
    assert model.aux_head[2].weight.grad.abs().sum() > 0
    assert model.state_proj.weight.grad.abs().sum() > 0  # the flow loss still reads the state
    with torch.no_grad():  # the head reads the cameras only: the joint state cannot leak in
        first = model.encode_prefix(text, images, state, return_aux=True)[2]
        other = model.encode_prefix(text, images, state + 1.0, return_aux=True)[2]
    assert torch.equal(first, other)
    plain = VLAModel(config)
    with pytest.raises(ValueError, match="auxiliary head"):
        flow_matching_loss(plain, text, images, state, actions, aux_target=target)


def test_spatial_softmax_finds_a_hot_spot():
    from vla_runtime.engine.model import SpatialSoftmax

    keypoints = SpatialSoftmax(channels=1, keypoints=1)
    with torch.no_grad():
        keypoints.conv.weight.fill_(1.0)
        keypoints.conv.bias.zero_()
        features = torch.zeros(1, 1, 5, 9)
        features[0, 0, 1, 6] = 50.0  # row 1 of 0..4, column 6 of 0..8
        xy = keypoints(features)[0, 0]
    assert torch.allclose(xy, torch.tensor([6 / 8 * 2 - 1, 1 / 4 * 2 - 1]), atol=1e-4)


def _bad_inputs():
    good = observation()

    def with_image(name, image):
        images = dict(good.images)
        images[name] = image
        return Observation(images, good.state, good.instruction)

    nan_state = good.state.copy()
    nan_state[2] = np.nan
    return [
        (with_image("scene", good.images["scene"][:100]), "image shape"),
        (with_image("scene", good.images["scene"].astype(np.float32)), "uint8"),
        (with_image("wrist", good.images["wrist"][..., :1]), "image shape"),
        (with_image("gripper", good.images["scene"]), "unknown camera"),
        (Observation({"scene": good.images["scene"]}, good.state, "x"), "missing image"),
        (Observation(good.images, good.state[:7], "x"), "state shape"),
        (Observation(good.images, nan_state, "x"), "NaN"),
        (Observation(good.images, good.state, "y" * 70), "at most 63"),
        (Observation(good.images, good.state, None), "instruction must be a string"),
    ]


@pytest.mark.parametrize("obs,message", _bad_inputs())
def test_malformed_observations_are_rejected(checkpoint, obs, message):
    with pytest.raises(PolicyError, match=message):
        TorchPolicy(checkpoint).infer(obs)


@pytest.mark.parametrize(
    "mode,message",
    [
        ("v5d0", "out of range"),
        ("fast", "neither a token"),
        ('{"vision_level": 2, "speed": 1}', "unknown fields"),
        (ComputeMode(2, 0, frozenset({"nose"})), "unknown cameras"),
        (3, "must be a ComputeMode"),
    ],
)
def test_bad_compute_modes_are_rejected(checkpoint, mode, message):
    with pytest.raises(PolicyError, match=message):
        TorchPolicy(checkpoint).infer(observation(), mode)


@pytest.mark.parametrize(
    "plan,message",
    [
        (np.zeros((4, 7)), "plan shape"),
        (np.zeros((17, 8)), "plan shape"),
        (np.zeros(8), "plan shape"),
        (np.full((3, 8), np.inf), "finite"),
    ],
)
def test_bad_plans_are_rejected(checkpoint, plan, message):
    with pytest.raises(PolicyError, match=message):
        TorchPolicy(checkpoint).infer(observation(), plan=plan)


def test_compute_mode_parsing():
    assert ComputeMode.parse("v3d2") == ComputeMode(3, 2)
    mode = ComputeMode.parse('{"vision_level": 2, "stable_cameras": ["scene"]}')
    assert mode.stable_cameras == frozenset({"scene"})
    assert ComputeMode.parse(mode.to_json()) == mode
    assert ComputeMode(4, 1).token == "v4d1"


@pytest.mark.parametrize(
    "text",
    [
        '{"vision_level": Infinity}',
        '{"vision_level": 1e400}',
        '{"vision_level": 1.5}',
        '{"vision_level": "2"}',
        '{"stable_cameras": "scene"}',
        '{"stable_cameras": [1]}',
        "[" * 100_000 + "]" * 100_000,
        "[" * 500 + "]" * 500,
        "v9d9",
        "",
    ],
)
def test_malformed_compute_modes_are_compute_mode_errors(text):
    with pytest.raises(ComputeModeError):
        ComputeMode.parse(text)


def test_unknown_backend_is_rejected():
    with pytest.raises(PolicyError, match="unknown back end"):
        load_policy("tpu")
