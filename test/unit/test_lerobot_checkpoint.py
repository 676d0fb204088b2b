"""A LeRobot policy directory given as a checkpoint is refused in one line that names it."""

from __future__ import annotations

import importlib.util
import json

import pytest

from vla_runtime.engine.checkpoint import lerobot_policy_type, load_checkpoint, load_spec
from vla_runtime.engine.policy import PolicyError


def _lerobot_policy_dir(root, policy_type="act"):
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"type": policy_type, "chunk_size": 100}))
    (root / "model.safetensors").write_bytes(b"not read before lerobot loads it")
    return root


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None, reason="lerobot installed")
@pytest.mark.parametrize("load", [load_checkpoint, load_spec])
def test_a_lerobot_policy_is_named_and_refused_without_lerobot(tmp_path, load):
    policy = _lerobot_policy_dir(tmp_path / "smolvla_policy", "smolvla")
    with pytest.raises(PolicyError) as refused:
        load(policy)
    message = str(refused.value)
    assert "\n" not in message
    assert "LeRobot policy of type 'smolvla'" in message
    assert "lerobot is not importable" in message and "Python >= 3.12 and torch < 2.12" in message
    assert "./dev.sh lerobot-check" in message


def test_only_directories_with_a_lerobot_config_and_weights_are_lerobot_policies(tmp_path):
    assert lerobot_policy_type(_lerobot_policy_dir(tmp_path / "act")) == "act"
    ours = _lerobot_policy_dir(tmp_path / "ours")
    (ours / "spec.json").write_text("{}")  # a checkpoint of this runtime
    assert lerobot_policy_type(ours) is None
    untyped = tmp_path / "untyped"
    untyped.mkdir()
    (untyped / "config.json").write_text("[]")
    (untyped / "model.safetensors").write_bytes(b"")
    assert lerobot_policy_type(untyped) is None
    with pytest.raises(PolicyError, match="is not a checkpoint"):
        load_checkpoint(untyped)
