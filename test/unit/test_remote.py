"""Remote back end: PolicyServer + RemoteClient over real ZeroMQ sockets on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine.policy import ActionChunk, Observation, PolicyError, PolicySpec
from vla_runtime.engine.remote import client as remote_client
from vla_runtime.engine.remote import keys as remote_keys
from vla_runtime.engine.remote import protocol, serve_cli, wire
from vla_runtime.engine.remote import server as remote_server

REPO = Path(__file__).resolve().parents[2]


def load_tiny_policy():
    """A fresh tiny torch policy (seed 0): same weights and noise sequence every time."""
    from vla_runtime.engine.factory import load_policy

    return load_policy(backend="torch", preset="tiny", device="cpu", seed=0)


@pytest.fixture(scope="module")
def tiny_policy():
    return load_tiny_policy()


class SlowPolicy:
    """A real policy that first sleeps when the instruction asks for it (shared, no reset)."""

    def __init__(self, policy, delay_s: float):
        self.policy, self.delay_s = policy, delay_s

    @property
    def spec(self) -> PolicySpec:
        return self.policy.spec

    def infer(
        self, observation, compute_mode=ComputeMode(), plan=None, noise_scale=None
    ) -> ActionChunk:
        if observation.instruction == "slow":
            time.sleep(self.delay_s)
        return self.policy.infer(observation, compute_mode, plan)


def make_observation(spec: PolicySpec, seed: int = 0, instruction: str = "pick up the cube"):
    rng = np.random.default_rng(seed)
    return Observation(
        images={
            cam.name: rng.integers(0, 256, (cam.height, cam.width, 3), dtype=np.uint8)
            for cam in spec.cameras
        },
        state=rng.normal(size=spec.state_dim).astype(np.float32),
        instruction=instruction,
        stamp=12.5 + seed,
    )


@pytest.fixture
def server(tiny_policy):
    srv = remote_server.PolicyServer(tiny_policy, bind="tcp://127.0.0.1:*").start()
    yield srv
    srv.stop()


def test_remote_inference_equals_local_inference(server, tiny_policy):
    # Each session serves a fresh copy of the policy (own caches and RNG): a fresh local
    # policy given the same calls must produce the same chunks, cache reuse included.
    local = load_tiny_policy()
    modes = [ComputeMode(), ComputeMode(1, 0), ComputeMode(3, 1), ComputeMode(2, 2, {"wrist"})]
    with remote_client.RemoteClient(server.endpoint, timeout_s=30) as client:
        assert client.spec == tiny_policy.spec
        for seed, mode in enumerate(modes):
            obs = make_observation(client.spec, seed)
            got = client.infer(obs, mode)
            want = local.infer(obs, mode)
            assert got.actions.shape == (client.spec.chunk_len, client.spec.action_dim)
            np.testing.assert_allclose(got.actions, want.actions, rtol=0, atol=1e-6)
            assert got.stamp == obs.stamp
            assert got.mode == want.mode
            assert got.info["server_infer_ms"] > 0


def test_plan_is_forwarded(server, tiny_policy):
    spec = tiny_policy.spec
    plan = np.full((3, spec.action_dim), 0.25, dtype=np.float32)
    obs = make_observation(spec, 4)
    with remote_client.RemoteClient(server.endpoint, timeout_s=30) as client:
        got = client.infer(obs, plan=plan)
    want = load_tiny_policy().infer(obs, plan=plan)
    np.testing.assert_allclose(got.actions, want.actions, rtol=0, atol=1e-6)


def test_instruction_and_caches_are_per_client(server, tiny_policy):
    spec = tiny_policy.spec
    obs_a = make_observation(spec, 5, instruction="open the drawer")
    obs_b = make_observation(spec, 6, instruction="close the drawer")
    reuse = ComputeMode(3, 2)  # reuses camera KV and warm-starts from the previous chunk
    local_a, local_b = load_tiny_policy(), load_tiny_policy()
    with (
        remote_client.RemoteClient(server.endpoint, timeout_s=30) as a,
        remote_client.RemoteClient(server.endpoint, timeout_s=30) as b,
    ):
        for _ in range(2):
            # a's second request omits its unchanged instruction, and both reuse cached
            # state: the server must use a's instruction and caches, never b's.
            got_a, got_b = a.infer(obs_a, reuse), b.infer(obs_b, reuse)
            np.testing.assert_allclose(
                got_a.actions, local_a.infer(obs_a, reuse).actions, atol=1e-6
            )
            np.testing.assert_allclose(
                got_b.actions, local_b.infer(obs_b, reuse).actions, atol=1e-6
            )
        assert got_a.mode == ComputeMode(3, 2)  # the reuse path really ran
        assert server.client_count == 2


def test_spec_mismatch_is_a_clear_error(server, tiny_policy):
    spec = tiny_policy.spec
    wrong = PolicySpec(
        cameras=spec.cameras,
        state_dim=spec.state_dim,
        action_dim=spec.action_dim,
        chunk_len=spec.chunk_len + 1,
        dt=spec.dt,
    )
    with pytest.raises(protocol.RemoteRejected, match="chunk_len"):
        remote_client.RemoteClient(server.endpoint, timeout_s=30, expected_spec=wrong)
    # The matching spec is accepted.
    with remote_client.RemoteClient(server.endpoint, timeout_s=30, expected_spec=spec) as client:
        assert client.spec == spec


def _raw_request(endpoint: str, frames: list[bytes]) -> dict:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(endpoint)
        sock.send_multipart(frames)
        assert sock.poll(10_000), "server did not answer"
        return wire.decode(sock.recv_multipart())
    finally:
        sock.close()


def test_server_rejects_other_protocol_versions(server):
    reply = _raw_request(server.endpoint, wire.encode({"v": 999, "id": 1, "op": "hello"}))
    assert not reply["ok"] and reply["kind"] == "version"
    assert "v999" in reply["error"] and f"v{wire.PROTOCOL_VERSION}" in reply["error"]


def test_client_rejects_server_of_other_protocol_version():
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = remote_client.RemoteClient(f"tcp://127.0.0.1:{port}", timeout_s=10, connect=False)
    try:
        import threading

        def answer_as_future_server():
            if router.poll(10_000):
                identity, *_ = router.recv_multipart()
                router.send_multipart([identity, msgpack.packb({"v": 999, "id": 1, "ok": True})])

        thread = threading.Thread(target=answer_as_future_server)
        thread.start()
        with pytest.raises(protocol.RemoteRejected, match="protocol version mismatch"):
            _ = client.spec
        thread.join()
    finally:
        client.close()
        router.close()


def test_malformed_requests_get_errors_and_server_survives(server, tiny_policy):
    reply = _raw_request(server.endpoint, [b"\xc1not msgpack"])
    assert not reply["ok"] and reply["kind"] == "bad_request"
    reply = _raw_request(server.endpoint, wire.encode({"v": wire.PROTOCOL_VERSION, "op": "infer"}))
    assert reply["kind"] == "handshake_required"
    with remote_client.RemoteClient(server.endpoint, timeout_s=30) as client:
        bad = make_observation(client.spec)
        bad.images[client.spec.cameras[0].name] = np.zeros((5, 5, 3), np.uint8)
        with pytest.raises(PolicyError):
            client.infer(bad)
        # Still serving after the rejection.
        assert client.infer(make_observation(client.spec)).actions.shape[0] == (
            tiny_policy.spec.chunk_len
        )


def test_request_timeout_then_recovery_with_same_client(tiny_policy):
    spec = tiny_policy.spec
    with (
        remote_server.PolicyServer(
            SlowPolicy(tiny_policy, 1.5), bind="tcp://127.0.0.1:*"
        ) as server,
        remote_client.RemoteClient(server.start().endpoint, timeout_s=0.5) as client,
    ):
        started = time.monotonic()
        with pytest.raises(protocol.RemoteUnavailable, match="no reply"):
            client.infer(make_observation(spec, instruction="slow"))
        assert time.monotonic() - started < 5.0
        time.sleep(1.5)  # let the server finish the slow request (its reply goes nowhere)
        client.timeout_s = 30
        obs = make_observation(spec, 3)
        got = client.infer(obs)
    assert got.stamp == obs.stamp
    assert got.actions.shape == (spec.chunk_len, spec.action_dim)


def test_no_server_is_a_clear_error():
    port = _free_port()
    with pytest.raises(protocol.RemoteUnavailable, match=f"127.0.0.1:{port}"):
        remote_client.RemoteClient(f"tcp://127.0.0.1:{port}", timeout_s=0.3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server_process(endpoint: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.engine.remote.serve_cli", "--backend", "torch"]
        + ["--preset", "tiny", "--bind", endpoint, *extra],
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        },
    )


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _infer_until_ok(client, obs, deadline_s: float):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return client.infer(obs)
        except protocol.RemoteUnavailable:
            if time.monotonic() > deadline:
                raise


def test_client_recovers_after_server_process_is_killed_and_restarted(tiny_policy):
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    obs = make_observation(tiny_policy.spec, 7)
    want = load_tiny_policy().infer(obs).actions  # each new session starts from seed 0
    process = _start_server_process(endpoint)
    client = remote_client.RemoteClient(endpoint, timeout_s=2.0, connect=False)
    try:
        np.testing.assert_allclose(_infer_until_ok(client, obs, 120).actions, want, atol=1e-5)
        process.kill()
        process.wait()
        with pytest.raises(protocol.RemoteUnavailable):
            client.infer(obs)
        process = _start_server_process(endpoint)
        np.testing.assert_allclose(_infer_until_ok(client, obs, 120).actions, want, atol=1e-5)
    finally:
        client.close()
        _stop(process)


# --- CURVE ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint, loopback",
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.0.0.2:5555", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("ipc:///tmp/vla.sock", True),
        ("inproc://policy", True),
        ("tcp://*:5555", False),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://192.168.1.10:5555", False),
        ("tcp://eth0:5555", False),
        ("tcp://robot-server.local:5555", False),
    ],
)
def test_loopback_detection(endpoint, loopback):
    assert remote_keys.is_loopback(endpoint) is loopback


def test_non_loopback_bind_without_keys_is_refused(tiny_policy):
    with pytest.raises(ValueError, match="CURVE"):
        remote_server.PolicyServer(tiny_policy, bind="tcp://0.0.0.0:*")
    # The CLI refuses before loading any model.
    assert serve_cli.serve_main(["--bind", "tcp://*:5999"]) == 2


def test_key_tool_gives_each_robot_its_own_pair_and_revokes_it(tmp_path):
    keys = tmp_path / "keys"
    assert serve_cli.serve_main(["--gen-keys", str(keys)]) == 0
    assert not list((keys / "authorized_clients").glob("*.key"))  # nobody until added
    for robot in ("arm1", "arm2"):
        assert serve_cli.serve_main(["--curve-keys", str(keys), "--add-robot", robot]) == 0
    secret, allowed = remote_keys.load_server_keys(keys)
    bundles = {r: remote_keys.load_client_keys(keys / "robots" / r) for r in ("arm1", "arm2")}
    for server_public, (client_public, client_secret) in bundles.values():
        assert zmq.curve_public(secret) == server_public
        assert zmq.curve_public(client_secret) == client_public
    assert bundles["arm1"][1] != bundles["arm2"][1]
    assert sorted(remote_keys.allowed_robots(allowed).values()) == ["arm1", "arm2"]
    assert (keys / "server.key_secret").stat().st_mode & 0o077 == 0
    assert (keys / "robots" / "arm1" / "client.key_secret").stat().st_mode & 0o077 == 0
    assert serve_cli.serve_main(["--curve-keys", str(keys), "--revoke-robot", "arm1"]) == 0
    assert list(remote_keys.allowed_robots(allowed).values()) == ["arm2"]
    # A second revocation, an unknown name, a bad name and a missing key directory: exit 2.
    assert serve_cli.serve_main(["--curve-keys", str(keys), "--revoke-robot", "arm1"]) == 2
    assert serve_cli.serve_main(["--curve-keys", str(keys), "--add-robot", "../x"]) == 2
    assert serve_cli.serve_main(["--add-robot", "arm3"]) == 2


@pytest.fixture
def curve_server(tiny_policy, tmp_path):
    keys = remote_keys.generate_keys(tmp_path / "keys")
    for robot in ("arm1", "arm2"):
        remote_keys.add_robot(keys, robot)
    secret, allowed = remote_keys.load_server_keys(keys)
    srv = remote_server.PolicyServer(
        tiny_policy, bind="tcp://0.0.0.0:*", curve_secret=secret, authorized_clients=allowed
    ).start()
    port = srv.endpoint.rsplit(":", 1)[1]
    yield srv, f"tcp://127.0.0.1:{port}", keys
    srv.stop()


def _robot_client(endpoint: str, keys: Path, robot: str, **kwargs):
    server_public, client_keys = remote_keys.load_client_keys(keys / "robots" / robot)
    return remote_client.RemoteClient(endpoint, server_public, client_keys, **kwargs)


def test_curve_client_with_keys_is_served(curve_server, tiny_policy):
    srv, endpoint, keys = curve_server
    assert srv.secure
    with _robot_client(endpoint, keys, "arm1", timeout_s=30) as client:
        obs = make_observation(client.spec, 9)
        np.testing.assert_allclose(
            client.infer(obs).actions, load_tiny_policy().infer(obs).actions, atol=1e-6
        )
    # The session is the robot's key's name, whatever the client calls itself.
    assert list(srv._sessions) == ["arm1"]


def test_curve_clients_without_the_right_keys_get_no_answer(curve_server):
    _, endpoint, keys = curve_server
    server_public, client_keys = remote_keys.load_client_keys(keys / "robots" / "arm1")
    wrong_server_public, _ = zmq.curve_keypair()
    attempts = {
        "plain client": dict(),
        "wrong server key": dict(server_public_key=wrong_server_public, client_keys=client_keys),
        "client key not authorised": dict(server_public_key=server_public),
    }
    for name, kwargs in attempts.items():
        with pytest.raises(protocol.RemoteUnavailable):
            remote_client.RemoteClient(endpoint, timeout_s=1.0, **kwargs)
            pytest.fail(f"{name} was answered")


def test_empty_allow_list_refuses_everyone(tiny_policy, tmp_path):
    keys = remote_keys.generate_keys(tmp_path / "keys")
    remote_keys.add_robot(keys, "arm1")
    remote_keys.revoke_robot(keys, "arm1")
    secret, allowed = remote_keys.load_server_keys(keys)
    server_public, _ = zmq.auth.load_certificate(keys / "server.key")
    for allow_list in (allowed, None):  # an empty directory, or none at all
        with remote_server.PolicyServer(
            tiny_policy, "tcp://127.0.0.1:*", curve_secret=secret, authorized_clients=allow_list
        ) as srv:
            srv.start()
            with pytest.raises(protocol.RemoteUnavailable):
                remote_client.RemoteClient(srv.endpoint, server_public, timeout_s=1.0)


def test_revoked_robot_is_refused_while_another_keeps_working(curve_server):
    srv, endpoint, keys = curve_server
    with (
        _robot_client(endpoint, keys, "arm1", timeout_s=30) as arm1,
        _robot_client(endpoint, keys, "arm2", timeout_s=30) as arm2,
    ):
        obs = make_observation(arm1.spec, 2)
        arm1.infer(obs)
        arm2.infer(obs)
        assert remote_keys.revoke_robot(keys, "arm1")
        deadline = time.monotonic() + 30
        with pytest.raises(protocol.RemoteRejected, match="not allowed"):
            while time.monotonic() < deadline:  # the server re-reads its list every second
                arm1.infer(obs)
        for _ in range(3):
            assert arm2.infer(obs).actions.shape[0] == arm2.spec.chunk_len
        assert "arm1" not in srv._sessions


def test_transport_bench_reports_overhead_per_path_and_targets():
    from vla_runtime.bench.transport import run_bench

    result = run_bench(n=30, warmup=5, fleet=False, progress=False)
    for path in ("zmq", "openpi"):
        figures = result["overhead_ms"][path]
        assert 0 < figures["p50"] <= figures["p99"] <= figures["max"]
    assert set(result["met"]) == {"zmq_overhead_p99_le_1ms", "openpi_overhead_p99_le_3ms"}
    assert result["settings"]["request_payload_bytes"] == 2 * 224 * 224 * 3 + 8 * 4
