"""The engine node runs a built engine named by `checkpoint:=engines/<dir>`, and refuses one
whose files changed after the build."""

from __future__ import annotations

import json
import shutil

import pytest
from test_engine_node import RobotSide, _check_chunk, _start_engine, _stop

from vla_runtime.engine.built_engine import build_engine
from vla_runtime.engine.onnx_backend import MANIFEST
from vla_runtime.engine.policy import PolicySpec

STARTUP_S = 120


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("node_engine")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLA_RUNTIME_ENGINES", str(root / "cache"))
        return build_engine(None, "onnxruntime", out=root / "engines", preset="tiny", seed=0)


@pytest.mark.integration
def test_engine_node_publishes_chunks_from_a_built_engine(rclpy_context, tmp_path, engine_dir):
    spec = PolicySpec.from_dict(json.loads((engine_dir / MANIFEST).read_text())["spec"])
    process, log = _start_engine(
        tmp_path, "engine", "run_mode:=continuous", "backend:=onnxruntime",
        f"checkpoint:={engine_dir}",
    )  # fmt: skip
    robot = RobotSide(rclpy_context)
    try:
        assert robot.spin_until(lambda: len(robot.chunks) >= 2, STARTUP_S), log.read_text()
        for chunk in robot.chunks:
            _check_chunk(chunk, spec, robot.image_stamps)
        assert "engine ready: onnxruntime policy" in log.read_text()
    finally:
        robot.close()
        _stop(process)


@pytest.mark.integration
def test_engine_node_refuses_a_changed_engine(tmp_path, engine_dir):
    changed = tmp_path / engine_dir.name
    shutil.copytree(engine_dir, changed)
    graph = changed / "expert_step.onnx"
    graph.write_bytes(graph.read_bytes() + b"\0")
    process, log = _start_engine(
        tmp_path, "engine", "backend:=onnxruntime", f"checkpoint:={changed}"
    )
    try:
        assert process.wait(timeout=STARTUP_S) != 0
    finally:
        _stop(process)
    assert "expert_step.onnx differs from the file the engine was built with" in log.read_text()
