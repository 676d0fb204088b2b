"""What the engine node is configured with: the state mapping from the robot's joints, and the
policy source (local back end or policy server)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.engine.checkpoint import load_spec
from vla_runtime.engine.policy_source import BACKENDS, PolicySource
from vla_runtime.engine.remote.client import RemoteClient
from vla_runtime.engine.remote.openpi_policy import OpenpiPolicy
from vla_runtime.engine.remote.protocol import RemoteUnavailable
from vla_runtime.engine.remote.ray_client import RayClient
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
    assert BACKENDS == ("torch", "onnxruntime", "tensorrt", "remote", "openpi", "ray", "python")
    assert source(device="cuda:0").location == "cuda:0"
    remote = source(backend="remote", endpoint="tcp://127.0.0.1:1", remote_timeout_s=0.5)
    assert remote.location == "tcp://127.0.0.1:1"
    client = remote.open()  # nothing listens there: no error until asked
    try:
        assert isinstance(client, RemoteClient) and client.timeout_s == 0.5
    finally:
        client.close()
    assert source(backend="remote").location == "tcp://127.0.0.1:5555"
    fleet = source(backend="ray", remote_timeout_s=0.5).open()
    assert isinstance(fleet, RayClient) and fleet.url == "http://127.0.0.1:8000/"


def test_an_openpi_source_connects_on_first_use_and_takes_its_spec_from_a_checkpoint(tmp_path):
    assert "openpi" in BACKENDS
    assert source(backend="openpi").location == "ws://127.0.0.1:8000"
    key_file = tmp_path / "key"
    key_file.write_text("0123456789abcdef0123\n")
    given = source(
        backend="openpi",
        endpoint="ws://127.0.0.1:1",
        checkpoint="checkpoints/vla_tiny_sim",
        api_key_file=str(key_file),
        openpi_image_keys=["observation/image", "observation/wrist_image"],
    )
    policy = given.open()  # nothing listens there: no error until asked
    assert isinstance(policy, OpenpiPolicy)
    assert policy._fallback_spec == load_spec("checkpoints/vla_tiny_sim")
    assert policy._headers == {"Authorization": "Api-Key 0123456789abcdef0123"}
    with pytest.raises(RemoteUnavailable, match="cannot connect to ws://127.0.0.1:1"):
        _ = policy.spec
    with pytest.raises(ValueError, match="must start with ws:// or wss://"):
        source(backend="openpi", endpoint="tcp://127.0.0.1:5555").open()


def test_a_python_source_builds_its_policy_from_a_callable_with_the_json_arguments():
    built = source(
        backend="python",
        checkpoint="vla_runtime.data.perception_expert:PerceptionExpert",
        policy_args='{"chunk_len": 8}',
        robot="fr3",
    ).open()
    assert built.spec.chunk_len == 8 and built.spec.robot == "fr3"
    assert [c.name for c in built.spec.cameras] == ["scene_hd", "wrist"]
    for checkpoint, arguments, why in [
        ("vla_runtime.data.perception_expert", "", "package.module:callable"),
        ("vla_runtime.data.perception_expert:Nothing", "", "no callable 'Nothing'"),
        ("vla_runtime.data.perception_expert:PerceptionExpert", "[1]", "JSON object"),
        ("vla_runtime.data.perception_expert:PerceptionExpert", "{", "not JSON"),
    ]:
        with pytest.raises(ValueError, match=why):
            source(backend="python", checkpoint=checkpoint, policy_args=arguments).open()


def test_a_checkpoint_for_another_arm_is_refused_with_one_line(tmp_path):
    shipped = load_spec(shipped_checkpoint())
    assert shipped.robot == "fr3"
    StateMapping.for_robot("fr3").check_spec(shipped, "fr3")
    # The Panda has the FR3's shapes (7 joints + gripper): only the checkpoint's robot tells.
    panda = StateMapping.for_robot("panda")
    assert panda.state_dim == shipped.state_dim
    with pytest.raises(ValueError, match="trained for robot 'fr3', this engine drives 'panda'"):
        panda.check_spec(shipped, "panda")
    with pytest.raises(ValueError, match="policy state_dim 8 != 6 arm joints"):
        StateMapping.for_robot("ur5e").check_spec(replace(shipped, robot=""), "ur5e")


def test_random_weights_take_the_engines_robot_columns():
    policy = source(robot="ur5e").open()
    assert policy.spec.robot == "ur5e" and policy.spec.state_dim == 7
    assert policy.spec.joint_names[:2] == ("shoulder_pan_joint", "shoulder_lift_joint")
    StateMapping.for_robot("ur5e").check_spec(policy.spec, "ur5e")


def test_a_gripper_without_joints_is_where_the_gate_last_commanded_it():
    mapping = StateMapping.for_robot("ur5e")
    arm = list(mapping.arm_joints)
    q = [0.1, -1.5, 1.4, -1.6, -1.5, 0.2]
    fingers = list(mapping.gripper_joints)
    # auto: a joint state without the fingers gets them at the commanded opening (per finger).
    names, positions, commanded = mapping.with_commanded_gripper(arm, q, 0.03, "auto")
    assert commanded and names == [*arm, *fingers]
    assert mapping.state_from(names, positions)[-1] == pytest.approx(0.06)  # the width
    # auto with fingers reported: theirs; commands: the commanded opening replaces them.
    reported = ([*arm, *fingers], [*q, 0.01, 0.01])
    assert mapping.with_commanded_gripper(*reported, 0.03, "auto")[2] is False
    names, positions, commanded = mapping.with_commanded_gripper(*reported, 0.03, "commands")
    assert commanded and mapping.state_from(names, positions)[-1] == pytest.approx(0.06)
    # joints: untouched, so a missing finger is still the sync error it always was.
    names, positions, commanded = mapping.with_commanded_gripper(arm, q, 0.03, "joints")
    assert not commanded and names == arm
    with pytest.raises(ValueError, match="gripper source must be one of"):
        mapping.with_commanded_gripper(arm, q, 0.03, "guess")
