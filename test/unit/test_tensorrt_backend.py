"""TensorRT back end: plan-cache keys and profiles (pure, everywhere); build + run (GPU only)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine import tensorrt_backend as trtb
from vla_runtime.engine.policy import Observation, PolicyError


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The tiny model's real ONNX export (the files TensorRT builds from) and its manifest."""
    from vla_runtime.engine.checkpoint import random_checkpoint
    from vla_runtime.engine.onnx_backend import MANIFEST, export_onnx

    checkpoint = random_checkpoint("tiny", 0)
    directory = export_onnx(checkpoint, tmp_path_factory.mktemp("onnx"))
    return checkpoint, directory, json.loads((directory / MANIFEST).read_text())


BASE = dict(
    stage="vision",
    onnx_sha256="ab" * 32,
    gpu_name="NVIDIA H200",
    compute_capability=(9, 0),
    precision="fp16",
    trt_version="10.9.0",
    profiles=[{"image": ((1, 224, 224, 3), (1, 224, 224, 3), (8, 224, 224, 3))}],
)


def test_plan_path_is_stable_and_readable(tmp_path):
    path = trtb.make_plan_key(**BASE).path(tmp_path)
    assert path == trtb.make_plan_key(**BASE).path(tmp_path)
    assert path.parent == tmp_path / "tensorrt" / "nvidia-h200-sm90-fp16-trt10.9.0"
    assert path.name.startswith("vision-abababababababab-") and path.suffix == ".plan"


@pytest.mark.parametrize(
    "field, value",
    [
        ("stage", "instruction"),
        ("onnx_sha256", "cd" * 32),
        ("gpu_name", "NVIDIA H100 80GB HBM3"),
        ("compute_capability", (8, 9)),
        ("precision", "bf16"),
        ("trt_version", "10.10.0"),
        ("profiles", [{"image": ((1, 224, 224, 3), (1, 224, 224, 3), (16, 224, 224, 3))}]),
    ],
)
def test_every_dependency_changes_the_plan_path(tmp_path, field, value):
    changed = trtb.make_plan_key(**{**BASE, field: value})
    assert changed.path(tmp_path) != trtb.make_plan_key(**BASE).path(tmp_path)


def test_same_gpu_model_different_wording_of_precision_share_plans(tmp_path):
    alias = trtb.make_plan_key(**{**BASE, "precision": "float16"})
    assert alias.path(tmp_path) == trtb.make_plan_key(**BASE).path(tmp_path)


def test_precision_and_gpu_names_are_normalised():
    assert trtb.normalise_precision("BFloat16") == "bf16"
    assert trtb.normalise_precision("half") == "fp16"
    with pytest.raises(ValueError, match="fp32"):
        trtb.normalise_precision("int4")
    assert trtb.gpu_slug("NVIDIA H200 (141GB) / SXM") == "nvidia-h200-141gb-sxm"


def test_file_hash_follows_content(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"model-a")
    first = trtb.file_sha256(path)
    path.write_bytes(b"model-b")
    assert trtb.file_sha256(path) != first


def test_profiles_cover_the_exported_shapes(exported):
    _, _, manifest = exported
    profiles = trtb.stage_profiles(manifest, max_batch=4)
    assert set(profiles) == set(trtb.STAGES)
    io = manifest["io"]
    lt = io["instruction"]["inputs"]["text_ids"][1]
    nv = io["vision"]["outputs"]["vision_tokens"][1]
    p = io["expert_step"]["inputs"]["prefix_bias"][1]
    assert p == lt + 2 * nv + 1  # text + 2 cameras + state token
    low, opt, high = profiles["instruction"][0]["text_ids"]
    assert (low, opt, high) == ((1, lt), (1, lt), (4, lt))
    camera, state = profiles["prefix_block"]
    assert camera["tokens"][2][:2] == (4, nv) and camera["past_bias"][2] == (4, lt)
    assert state["tokens"][2][:2] == (4, 1) and state["past_bias"][2] == (4, lt + 2 * nv)
    # Picking a profile by shape: a camera block, the state token, candidates, and a misfit.
    kv = manifest["io"]["prefix_block"]["inputs"]["past_kv"]
    dim = manifest["io"]["prefix_block"]["inputs"]["tokens"][2]
    past = lambda t: (kv[0], 2, 1, kv[3], t, kv[5])  # noqa: E731
    camera_shapes = {"tokens": (1, nv, dim), "past_kv": past(lt), "past_bias": (1, lt)}
    state_shapes = {
        "tokens": (1, 1, dim),
        "past_kv": past(lt + 2 * nv),
        "past_bias": (1, lt + 2 * nv),
    }
    assert trtb.profile_index(profiles["prefix_block"], camera_shapes) == 0
    assert trtb.profile_index(profiles["prefix_block"], state_shapes) == 1
    with pytest.raises(PolicyError, match="no TensorRT optimization profile"):
        trtb.profile_index(profiles["prefix_block"], {**camera_shapes, "past_bias": (1, lt + 1)})
    with pytest.raises(ValueError, match="max_batch"):
        trtb.stage_profiles(manifest, max_batch=0)


def test_missing_tensorrt_is_a_clear_error():
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="tensorrt"):
            trtb.load_tensorrt_policy()
    else:
        pytest.skip("tensorrt is installed here")


# ------------------------------------------------------------------------------ real TensorRT


def _require_tensorrt_gpu():
    try:
        trtb.import_tensorrt()
    except ImportError as exc:
        pytest.skip(f"TensorRT back end unverified here: {exc}")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("TensorRT back end unverified here: no CUDA GPU")


@pytest.mark.parametrize("precision, atol", [("fp32", 1e-3), ("fp16", 5e-2)])
def test_tensorrt_matches_torch_and_reuses_cached_plans(exported, tmp_path, precision, atol):
    _require_tensorrt_gpu()
    from vla_runtime.engine.torch_backend import TorchPolicy

    checkpoint, directory, _ = exported
    policy = trtb.TensorRTPolicy(directory, precision=precision, cache_root=tmp_path)
    assert sorted(policy.built) == sorted(trtb.STAGES)
    assert all(path.is_file() for path in policy.plan_paths.values())
    reference = TorchPolicy(checkpoint, device="cuda", seed=0)
    rng = np.random.default_rng(0)
    spec = policy.spec
    obs = Observation(
        images={
            c.name: rng.integers(0, 256, (c.height, c.width, 3), dtype=np.uint8)
            for c in spec.cameras
        },
        state=rng.normal(size=spec.state_dim).astype(np.float32),
        instruction="pick up the cube",
        stamp=1.0,
    )
    for mode in (ComputeMode(), ComputeMode(3, 0)):
        got, want = policy.infer(obs, mode), reference.infer(obs, mode)
        assert np.abs(got.actions - want.actions).max() <= atol, mode
    again = trtb.TensorRTPolicy(directory, precision=precision, cache_root=tmp_path)
    assert again.built == []  # every plan came from the cache
