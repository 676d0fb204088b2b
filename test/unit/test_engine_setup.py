"""What the engine node is configured with: the state mapping from the robot's joints, and the
policy source (local back end or policy server)."""

from __future__ import annotations

import pytest

from vla_runtime.engine.policy_source import BACKENDS, PolicySource
from vla_runtime.engine.remote.client import RemoteClient
from vla_runtime.engine.state_mapping import StateMapping

FR3_ARM = tuple(f"fr3_joint{i}" for i in range(1, 8))


def source(**given) -> PolicySource:
    defaults = dict(backend="torch", checkpoint="", preset="tiny", device="cpu", seed=0)
    defaults.update(threads=1, noise_scale=None, endpoint="", curve_keys="", remote_timeout_s=2.0)
    return PolicySource(**{**defaults, **given})


def test_joints_not_given_are_the_robots():
    mapping = StateMapping.for_robot("fr3")
    assert mapping.arm_joints == FR3_ARM
    assert mapping.gripper_joints == ("fr3_finger_joint1", "fr3_finger_joint2")
    assert mapping.joint_names == [*FR3_ARM, "fr3_finger_joint1"]
    given = StateMapping.for_robot("fr3", ["a", "b"], ["g"], "mean", "hand")
    assert (given.arm_joints, given.gripper_joints, given.joint_names) == (
        ("a", "b"),
        ("g",),
        ["a", "b", "hand"],
    )
    assert StateMapping.for_robot("fr3", ["a"], [], "none", "x").state_dim == 1
    with pytest.raises(ValueError, match="gripper_state must be one of"):
        StateMapping.for_robot("fr3", gripper_state="max")


def test_a_remote_source_runs_at_its_endpoint_and_connects_on_first_use():
    assert BACKENDS == ("torch", "onnxruntime", "tensorrt", "remote")
    assert source(device="cuda:0").location == "cuda:0"
    remote = source(backend="remote", endpoint="tcp://127.0.0.1:1", remote_timeout_s=0.5)
    assert remote.location == "tcp://127.0.0.1:1"
    client = remote.open()  # nothing listens there: no error until asked
    try:
        assert isinstance(client, RemoteClient) and client.timeout_s == 0.5
    finally:
        client.close()
