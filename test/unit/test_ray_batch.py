"""Fleet serving logic that needs no Ray: batched full compute, API keys, exposure, sessions."""

import asyncio
import copy

import numpy as np
import pytest

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.threads import limit_threads
from vla_runtime.engine.batch import infer_batch
from vla_runtime.engine.checkpoint import random_checkpoint
from vla_runtime.engine.policy import Observation, PolicyError
from vla_runtime.engine.remote import serve_cli, wire
from vla_runtime.engine.remote.keys import ApiKeyStore, check_exposure, load_api_keys
from vla_runtime.engine.remote.ray_serve import NOT_INSTALLED, PolicyReplica
from vla_runtime.engine.remote.sessions import ServerLimits
from vla_runtime.engine.torch_backend import TorchPolicy

limit_threads(1)


@pytest.fixture(scope="module")
def policy():
    return TorchPolicy(random_checkpoint("tiny", 0), seed=0)


def observation(spec, seed: int, instruction="pick up the red cube", stamp=1.0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {
        c.name: rng.integers(0, 256, (c.height, c.width, 3), dtype=np.uint8) for c in spec.cameras
    }
    state = rng.normal(size=spec.state_dim).astype(np.float32)
    return Observation(images, state, instruction, stamp)


def session(policy, seed: int):
    copied = copy.copy(policy)
    copied.reset()
    copied.reseed(seed)
    return copied


def test_batch_equals_per_request_inference(policy):
    instructions = ["pick up the red cube", "open the drawer", "pick up the red cube"]
    observations = [observation(policy.spec, i, text) for i, text in enumerate(instructions)]
    batched = infer_batch(policy, observations, [session(policy, 10 + i) for i in range(3)])
    for i, obs in enumerate(observations):
        single = session(policy, 10 + i).infer(obs)
        assert batched[i].actions.shape == single.actions.shape
        assert batched[i].actions.dtype == np.float32
        np.testing.assert_allclose(batched[i].actions, single.actions, atol=2e-4, rtol=1e-4)
        assert batched[i].stamp == obs.stamp
        assert batched[i].info["batch_size"] == 3.0


def test_batch_leaves_session_caches_for_cached_modes(policy):
    obs = observation(policy.spec, 0)
    batched, single = session(policy, 1), session(policy, 1)
    infer_batch(policy, [obs], [batched])
    single.infer(obs)
    obs2 = observation(policy.spec, 0, stamp=1.1)
    warm = ComputeMode(4, 2)
    a, b = batched.infer(obs2, warm), single.infer(obs2, warm)
    assert a.mode == b.mode == warm  # the cached prefix and previous chunk were there
    np.testing.assert_allclose(a.actions, b.actions, atol=2e-4, rtol=1e-4)


def test_bad_observation_fails_alone(policy):
    good, bad = observation(policy.spec, 0), observation(policy.spec, 1)
    bad.state = np.full(policy.spec.state_dim, np.nan, np.float32)
    results = infer_batch(policy, [good, bad], [session(policy, 0), session(policy, 1)])
    assert isinstance(results[1], PolicyError)
    assert results[0].actions.shape == (policy.spec.chunk_len, policy.spec.action_dim)


def test_tokens_file(tmp_path):
    path = tmp_path / "tokens"
    assert ApiKeyStore(path, "Bearer").robot_for("Bearer " + "a" * 20) is None  # missing: nobody
    path.write_text("# fleet\n\nrobot_a aaaaaaaaaaaaaaaaaaaa\nrobot-b bbbbbbbbbbbbbbbbbbbbbb\n")
    assert load_api_keys(path) == {"a" * 20: "robot_a", "b" * 22: "robot-b"}
    store = ApiKeyStore(path, "Bearer")
    assert store.robot_for("Bearer " + "a" * 20) == "robot_a"
    assert store.robot_for("bearer " + "b" * 22) == "robot-b"
    for header in (None, "", "Bearer ", "Basic " + "a" * 20, "Bearer " + "c" * 20):
        assert store.robot_for(header) is None
    for bad in ("robot_a short", "robot_a", "bad/name " + "x" * 20, "a " + "x" * 20 + " extra"):
        path.write_text(bad + "\n")
        with pytest.raises(ValueError) as err:
            load_api_keys(path)
        assert "x" * 20 not in str(err.value)  # a secret is never echoed
    path.write_text(f"r1 {'t' * 20}\nr2 {'t' * 20}\n")
    with pytest.raises(ValueError, match="already"):
        load_api_keys(path)
    assert (
        ApiKeyStore(path, "Bearer").robot_for("Bearer " + "t" * 20) is None
    )  # unreadable: everyone out


def test_non_loopback_needs_tls_and_tokens():
    check_exposure("127.0.0.1", None, None, None)
    check_exposure("localhost", None, None, None)
    check_exposure("::1", None, None, None)
    check_exposure("0.0.0.0", "c.pem", "k.pem", "tokens")
    for args in [(None, None, None), ("c.pem", "k.pem", None), (None, None, "tokens")]:
        with pytest.raises(ValueError, match="refusing to serve on 0.0.0.0"):
            check_exposure("0.0.0.0", *args)
    with pytest.raises(ValueError, match="both"):
        check_exposure("127.0.0.1", "c.pem", None, None)


def test_serve_refuses_an_exposed_ray_host(caplog):
    assert serve_cli.serve_main(["--engine", "ray", "--bind", "http://0.0.0.0:8000"]) == 2
    assert any("refusing to serve on 0.0.0.0" in r.getMessage() for r in caplog.records)
    assert serve_cli.serve_main(["--engine", "ray", "--protocol", "openpi"]) == 2
    assert serve_cli.serve_main(["--engine", "ray", "--bind", "ws://127.0.0.1:8000"]) == 2
    assert "vla_runtime[fleet]" in NOT_INSTALLED


def _request(op, request_id, **body):
    return {"v": wire.PROTOCOL_VERSION, "op": op, "id": request_id, **body}


def test_replica_sessions_unbatched(policy):
    replica = PolicyReplica(lambda: policy, limits=ServerLimits(max_sessions=1), max_batch_size=1)
    obs = observation(policy.spec, 0)
    infer = _request("infer", 2, images=obs.images, state=obs.state, stamp=1.0,
                     instruction=obs.instruction, mode={})  # fmt: skip

    async def run():
        first = await replica.serve_request("r1", infer)
        assert first["kind"] == "handshake_required"
        hello = await replica.serve_request("r1", _request("hello", 1))
        assert hello["ok"] and hello["spec"] == policy.spec.to_dict()
        reply = await replica.serve_request("r1", infer)
        assert reply["ok"] and reply["actions"].shape == (policy.spec.chunk_len, 8)
        assert set(reply["timing_ms"]) == {"queue", "infer"} and reply["replica"]
        await replica.serve_request("r2", _request("hello", 3))  # evicts r1 (limit 1)
        assert (await replica.serve_request("r1", infer))["kind"] == "handshake_required"
        old = await replica.serve_request("r2", {**_request("hello", 4), "v": 1})
        assert old["kind"] == "version"

    asyncio.run(run())
