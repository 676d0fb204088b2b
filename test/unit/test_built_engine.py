"""`vla-runtime export` / `build-engine` and loading a built engine through the factory: the
same chunks as the plain ONNX Runtime back end, and a refusal for any changed file or spec."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_runtime.cli import main
from vla_runtime.engine import built_engine
from vla_runtime.engine.checkpoint import load_checkpoint, random_checkpoint, save_checkpoint
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.onnx_backend import FILES, MANIFEST, OrtPolicy
from vla_runtime.engine.policy import Observation, PolicyError
from vla_runtime.engine.torch_backend import TorchPolicy

REPO = Path(__file__).resolve().parents[2]
SEED = 4

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A saved tiny checkpoint, its export and its onnxruntime engine, all made by the CLI."""
    root = tmp_path_factory.mktemp("built")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLA_RUNTIME_ENGINES", str(root / "cache"))  # never the repository's
        checkpoint = save_checkpoint(root / "vla_test", random_checkpoint("tiny", seed=7))
        assert main(["export", "--checkpoint", str(checkpoint), "--out", str(root / "x")]) == 0
        args = ["--checkpoint", str(checkpoint), "--backend", "onnxruntime", "--out"]
        assert main(["build-engine", *args, str(root / "engines")]) == 0
    (engine,) = (root / "engines").iterdir()
    (export,) = (root / "x").iterdir()
    return checkpoint, export, engine


def observation() -> Observation:
    rng = np.random.default_rng(0)
    images = {n: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for n in ("scene", "wrist")}
    return Observation(images, rng.normal(size=8).astype(np.float32), "stack the cups", 0.0)


def test_export_writes_the_graphs_and_their_manifest(built):
    _, export, _ = built
    manifest = json.loads((export / MANIFEST).read_text())
    assert export.name.startswith("onnx-")
    assert sorted(manifest["files"]) == sorted(FILES)
    assert all((export / file).is_file() for file in manifest["files"].values())


def test_engine_manifest_records_what_the_engine_depends_on(built):
    checkpoint, export, engine = built
    manifest = json.loads((engine / MANIFEST).read_text())
    assert engine.name.startswith("vla_test-") and len(engine.name) == len("vla_test-") + 12
    assert (manifest["backend"], manifest["precision"], manifest["device"]) == (
        "onnxruntime",
        "fp32",
        "cpu",
    )
    assert manifest["graph_optimization_level"] == "ORT_ENABLE_ALL"
    assert {"python", "torch", "onnx", "onnxruntime"} <= set(manifest["versions"])
    assert manifest["checkpoint"]["path"] == str(checkpoint.resolve())
    spec = json.loads((checkpoint / "spec.json").read_text())
    assert manifest["checkpoint"]["spec_sha256"] == built_engine.spec_sha256(
        spec["spec"], spec["model"], spec["normalization"]
    )
    for file in manifest["files"].values():  # every graph ORT loads is hashed
        assert manifest["sha256"][file] == built_engine.file_sha256(engine / file)
    assert manifest["source_onnx_sha256"]["vision.onnx"] == built_engine.file_sha256(
        export / "vision.onnx"
    )


def test_built_engine_gives_the_plain_onnxruntime_chunk(built):
    checkpoint, export, engine = built
    from_engine = load_policy("onnxruntime", str(engine), seed=SEED, threads=1)
    plain = OrtPolicy(export, seed=SEED, threads=1)
    obs = observation()
    a = from_engine.infer(obs).actions
    b = plain.infer(obs).actions
    assert a.shape == (16, 8) and np.all(np.isfinite(a))
    error = float(np.abs(a - b).max())
    print(f"built engine vs plain ONNX Runtime: max abs err {error:.2e}")
    assert error < 1e-4
    # The comparison can fail: another seed's start noise gives another chunk.
    other = OrtPolicy(export, seed=SEED + 1, threads=1).infer(obs).actions
    assert float(np.abs(other - b).max()) > 1e-2
    reference = TorchPolicy(load_checkpoint(checkpoint), seed=SEED).infer(obs).actions
    assert float(np.abs(a - reference).max()) < 1e-3  # and the torch reference agrees


def _copy(engine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / engine.name
    shutil.copytree(engine, copy)
    return copy


@pytest.mark.parametrize("file", ["vision.onnx", "expert_step.onnx.data"])
def test_a_changed_file_is_refused_in_one_line(built, tmp_path, file):
    engine = _copy(built[2], tmp_path)
    data = bytearray((engine / file).read_bytes())
    data[len(data) // 2] ^= 0x01
    (engine / file).write_bytes(bytes(data))
    with pytest.raises(PolicyError, match=f"{file} differs .*SHA-256 mismatch") as refused:
        load_policy("onnxruntime", str(engine))
    assert "\n" not in str(refused.value)


def test_a_missing_file_or_changed_spec_is_refused(built, tmp_path):
    engine = _copy(built[2], tmp_path)
    (engine / "state_embed.onnx").unlink()
    with pytest.raises(PolicyError, match="state_embed.onnx is missing"):
        load_policy("onnxruntime", str(engine))
    engine = _copy(built[2], tmp_path / "spec")
    manifest = json.loads((engine / MANIFEST).read_text())
    manifest["spec"]["dt"] *= 2
    (engine / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(PolicyError, match="does not match the checkpoint"):
        load_policy("onnxruntime", str(engine))


def test_an_engine_runs_only_on_the_back_end_and_device_it_was_built_for(built):
    engine = str(built[2])
    with pytest.raises(PolicyError, match="onnxruntime engine; load it with backend onnxruntime"):
        load_policy("torch", engine)
    with pytest.raises(PolicyError, match="needs its own build"):
        load_policy("onnxruntime", engine, device="cuda:0")


def test_what_cannot_be_built_here_is_one_line_and_exit_2(tmp_path, capsys):
    out = str(tmp_path / "engines")
    base = ["build-engine", "--preset", "tiny", "--out", out]
    assert main([*base, "--backend", "onnxruntime", "--precision", "fp16"]) == 2
    assert "onnxruntime fp16 on CPU is refused" in capsys.readouterr().err
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the TensorRT refusal is for machines without one")
    assert main([*base, "--backend", "tensorrt", "--precision", "fp16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vla-runtime build-engine: error: cannot build a TensorRT engine here")
    assert err.count("\n") == 1
    assert not Path(out).exists()  # refused before any work


def test_built_engines_are_not_committed_but_their_readme_is():
    ignored = subprocess.run(
        ["git", "check-ignore", "engines/vla_tiny_sim-0123456789ab/vision.onnx.data",
         "engines/vla_tiny_sim-0123456789ab/manifest.json", "engines/cache/x", "engines/README.md",
         "engines/verify_gpu.sh"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert ignored.stdout.split() == [
        "engines/vla_tiny_sim-0123456789ab/vision.onnx.data",
        "engines/vla_tiny_sim-0123456789ab/manifest.json",
        "engines/cache/x",
    ]


def test_tensorrt_engine_matches_torch_and_refuses_a_changed_plan(tmp_path, monkeypatch):
    """GPU only: build-engine --backend tensorrt, loaded through the factory."""
    if not torch.cuda.is_available():
        pytest.skip("TensorRT engines unverified here: no CUDA GPU")
    try:
        built_engine.import_tensorrt()
    except ImportError as exc:
        pytest.skip(f"TensorRT engines unverified here: {exc}")
    monkeypatch.setenv("VLA_RUNTIME_ENGINES", str(tmp_path / "cache"))
    checkpoint = save_checkpoint(tmp_path / "vla_gpu", random_checkpoint("tiny", seed=7))
    engine = built_engine.build_engine(
        str(checkpoint), "tensorrt", "fp16", "cuda:0", tmp_path / "engines"
    )
    manifest = json.loads((engine / MANIFEST).read_text())
    assert manifest["gpu"]["name"] == torch.cuda.get_device_name(0)
    assert {"tensorrt", "cuda"} <= set(manifest["versions"])
    policy = load_policy("tensorrt", str(engine), device="cuda:0", seed=SEED)
    assert policy.built == []  # every plan came from the engine directory
    reference = TorchPolicy(load_checkpoint(checkpoint), device="cuda", seed=SEED)
    obs = observation()
    error = float(np.abs(policy.infer(obs).actions - reference.infer(obs).actions).max())
    print(f"TensorRT fp16 engine vs torch: max abs err {error:.2e}")
    assert error < 5e-2
    plan = engine / manifest["plans"]["expert_step"]
    data = bytearray(plan.read_bytes())
    data[len(data) // 2] ^= 0x01
    plan.write_bytes(bytes(data))
    with pytest.raises(PolicyError, match="SHA-256 mismatch"):
        load_policy("tensorrt", str(engine), device="cuda:0")
