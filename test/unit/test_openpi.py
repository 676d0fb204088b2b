"""openpi's websocket protocol: `OpenpiServer` against the real `openpi-client` package, and the
engine's `openpi` back end (`OpenpiPolicy`) against our server and against a bare openpi-style
server that does not describe its policy."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import replace

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from test_remote import load_tiny_policy
from websockets.sync.client import connect
from websockets.sync.server import serve

from vla_runtime.bench.echo import BENCH_SPEC, EchoPolicy
from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine.checkpoint import load_spec
from vla_runtime.engine.policy import Observation, PolicyError
from vla_runtime.engine.remote import openpi_protocol as op
from vla_runtime.engine.remote import packed, serve_cli
from vla_runtime.engine.remote.openpi_policy import OpenpiPolicy
from vla_runtime.engine.remote.openpi_server import OpenpiServer
from vla_runtime.engine.remote.protocol import RemoteError, RemoteRejected, RemoteUnavailable
from vla_runtime.engine.remote.sessions import ServerLimits, session_policy

KEY_A, KEY_B = "arm1-0123456789abcdef", "arm2-0123456789abcdef"


@pytest.fixture(scope="module")
def tiny_policy():
    return load_tiny_policy()


@pytest.fixture(scope="module")
def server(tiny_policy):
    with OpenpiServer(tiny_policy, port=0) as srv:
        srv.start()
        yield srv


def _observation(spec, stamp=3.25, seed=0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {c.name: rng.integers(0, 256, (c.height, c.width, 3), np.uint8) for c in spec.cameras}
    state = rng.normal(size=spec.state_dim).astype(np.float32)
    return Observation(images, state, "pick up the red cube", stamp)


def _openpi_observation(observation: Observation) -> dict:
    obs = {op.image_key(name): image for name, image in observation.images.items()}
    return {**obs, op.STATE_KEY: observation.state, op.PROMPT_KEY: observation.instruction}


def test_openpi_client_gets_the_policys_chunks(server, tiny_policy):
    spec = tiny_policy.spec
    client = WebsocketClientPolicy(server.url)
    metadata = client.get_server_metadata()
    assert metadata["action_horizon"] == spec.chunk_len
    assert metadata["observation_keys"]["images"] == [f"observation/{c.name}" for c in spec.cameras]
    assert metadata[op.METADATA_KEY]["spec_hash"] == server.spec_hash
    observation = _observation(spec)
    reply = client.infer(_openpi_observation(observation))
    want = session_policy(tiny_policy, 0).infer(observation).actions
    np.testing.assert_allclose(reply["actions"], want, atol=1e-5)
    assert reply["server_timing"]["infer_ms"] > 0
    # A malformed observation is one line of text (openpi-client raises it), never a traceback,
    # and the connection keeps serving.
    with pytest.raises(RuntimeError, match="bad_request: missing image array") as error:
        client.infer({"observation/state": observation.state})
    assert "Traceback" not in str(error.value)
    wrong = _openpi_observation(observation)
    wrong[op.image_key(spec.cameras[0].name)] = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(RuntimeError, match="policy: "):
        client.infer(wrong)
    assert client.infer(_openpi_observation(observation))["actions"].shape == want.shape


def test_the_openpi_back_end_checks_stamps_and_passes_modes_and_plans(server, tiny_policy):
    spec = tiny_policy.spec
    reference = session_policy(tiny_policy, 0)
    with OpenpiPolicy(server.url, timeout_s=10.0) as policy:
        assert policy.spec == spec and policy.pinned_identity == server.spec_hash
        observation = _observation(spec, stamp=12.5)
        chunk = policy.infer(observation)
        np.testing.assert_allclose(chunk.actions, reference.infer(observation).actions, atol=1e-5)
        assert chunk.stamp == 12.5 and chunk.info["server_infer_ms"] > 0
        assert chunk.timings_ms["transport"] >= 0
        mode = ComputeMode(1, 1)
        plan = chunk.actions[:3]
        later = _observation(spec, stamp=12.6, seed=1)
        cached = policy.infer(later, mode, plan)
        assert cached.mode == mode
        np.testing.assert_allclose(
            cached.actions, reference.infer(later, mode, plan).actions, atol=1e-5
        )
        bad = _observation(spec)
        bad.state = np.zeros(spec.state_dim + 3, np.float32)
        with pytest.raises(PolicyError, match="openpi server rejected the observation"):
            policy.infer(bad)


def _bare_openpi_server(replies: list, seen: list, metadata=None):
    """An openpi-style server that, like openpi's own, does not describe its policy: it answers
    each observation with the next of `replies` (packed with openpi's own msgpack_numpy)."""

    def handler(ws):
        ws.send(msgpack_numpy.packb(metadata or {"policy": "pi0-like"}))
        for message in ws:
            seen.append(msgpack_numpy.unpackb(message))
            reply = replies.pop(0)
            ws.send(reply if isinstance(reply, str) else msgpack_numpy.packb(reply))

    srv = serve(handler, "127.0.0.1", 0, compression=None)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"ws://127.0.0.1:{srv.socket.getsockname()[1]}"


def test_the_openpi_back_end_drives_another_openpi_server_and_refuses_bad_chunks():
    spec = load_spec("checkpoints/vla_tiny_sim")
    good = np.linspace(0, 1, 20 * spec.action_dim).reshape(20, spec.action_dim)
    nan = good.copy()
    nan[3, 2] = np.nan
    replies = [
        {"actions": good},  # a longer horizon than the spec: its first chunk_len rows
        {"actions": good[:, :-1]},
        {"actions": good[:5]},
        {"actions": nan},
        {"actions": good.astype(np.int64)},
        "Traceback (most recent call last):\n  ...\nValueError: no such camera\n",
    ]
    seen: list = []
    srv, url = _bare_openpi_server(replies, seen)
    keys = ("observation/exterior_image_1_left", "observation/wrist_image_left")
    try:
        with pytest.raises(RemoteError, match="does not describe its policy"):
            OpenpiPolicy(url)
        policy = OpenpiPolicy(url, spec=load_spec("checkpoints/vla_tiny_sim"), image_keys=keys,
                              state_key="observation/joint_position")  # fmt: skip
        assert policy.pinned_identity.startswith("openpi:")
        observation = _observation(spec, stamp=7.0)
        chunk = policy.infer(observation, ComputeMode(2, 1), plan=np.zeros((2, 8)))
        np.testing.assert_allclose(chunk.actions, good[: spec.chunk_len].astype(np.float32))
        assert chunk.stamp == 7.0 and chunk.mode == ComputeMode(0, 0)  # it ran full compute
        request = seen[-1]
        assert set(request) == {*keys, "observation/joint_position", "prompt"}  # no extras
        np.testing.assert_array_equal(request[keys[1]], observation.images["wrist"])
        for reason in ("expected \\(H, 8\\)", "needs 16", "non-finite", "not a float array"):
            with pytest.raises(RemoteError, match=reason):
                policy.infer(observation)
        with pytest.raises(
            RemoteError, match=r"openpi server error \(server\): ValueError: no such"
        ):
            policy.infer(observation)
    finally:
        srv.shutdown()


def test_api_keys_tls_and_limits(tiny_policy, tmp_path):
    with pytest.raises(ValueError, match="without TLS and API keys"):
        OpenpiServer(tiny_policy, host="0.0.0.0", port=0)
    keys = tmp_path / "api_keys"
    keys.write_text(f"arm1 {KEY_A}\narm2 {KEY_B}\n")
    limits = ServerLimits(max_sessions=2)
    with OpenpiServer(tiny_policy, port=0, api_keys=keys, limits=limits) as srv:
        srv.start()
        with pytest.raises(RemoteRejected, match="refused the API key"):
            OpenpiPolicy(srv.url, api_key="arm9-0123456789abcdef")
        with pytest.raises(RemoteRejected, match="refused the API key"):
            OpenpiPolicy(srv.url)
        first = WebsocketClientPolicy(srv.url, api_key=KEY_A)
        second = OpenpiPolicy(srv.url, api_key=KEY_B, timeout_s=10.0)
        with pytest.raises(RemoteUnavailable, match="HTTP 503"):  # at the connection cap
            OpenpiPolicy(srv.url, api_key=KEY_A)
        observation = _observation(tiny_policy.spec)
        assert first.infer(_openpi_observation(observation))["actions"].shape == (16, 8)
        assert second.infer(observation).actions.shape == (16, 8)
        second.close()
        first._ws.close()
        keys.write_text(f"arm1 {KEY_A}\n")  # arm2 revoked: refused from its next connection
        deadline = time.monotonic() + 10
        while True:
            try:
                OpenpiPolicy(srv.url, api_key=KEY_B).close()
            except RemoteRejected:
                break
            except RemoteUnavailable:  # connections closed a moment ago may still count
                pass
            assert time.monotonic() < deadline, "a revoked key was still accepted after 10 s"
        with OpenpiPolicy(srv.url, api_key=KEY_A, timeout_s=10.0) as kept:
            assert kept.infer(observation).actions.shape == (16, 8)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_wss_with_a_pinned_certificate(tiny_policy, tmp_path):
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out",
         cert, "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    keys = tmp_path / "api_keys"
    keys.write_text(f"arm1 {KEY_A}\n")
    with OpenpiServer(tiny_policy, port=0, tls=tls, api_keys=keys) as srv:
        srv.start()
        assert srv.url.startswith("wss://")
        with pytest.raises(RemoteUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            OpenpiPolicy(srv.url, api_key=KEY_A)  # the system's CAs do not know it
        with OpenpiPolicy(srv.url, api_key=KEY_A, tls_ca=str(cert), timeout_s=10.0) as policy:
            assert policy.infer(_observation(tiny_policy.spec)).actions.shape == (16, 8)


def test_hostile_messages_are_refused_and_the_server_keeps_serving(server, tiny_policy):
    with connect(server.url, max_size=None, compression=None) as ws:
        ws.recv()  # metadata
        deep: object = 1
        for _ in range(50):
            deep = [deep]
        complex_array = {b"__ndarray__": True, b"data": b"\0" * 16, b"dtype": "<c16",
                         b"shape": [1]}  # fmt: skip
        big_endian = {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": ">f8", b"shape": [1]}
        short = {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f8", b"shape": [2 << 40]}
        hostile = [
            msgpack.packb({"x": deep}),
            msgpack.packb({op.STATE_KEY: complex_array}),
            msgpack.packb({op.STATE_KEY: big_endian}),
            msgpack.packb({op.STATE_KEY: short}),
            msgpack.packb([{}] * 100_000),
            b"\xc1",
            "text",
        ]
        for message in hostile:
            ws.send(message)
            reply = ws.recv(timeout=10)
            assert isinstance(reply, str) and reply.startswith("bad_request: "), reply
            assert "\n" not in reply
        ws.send(b"\0" * (33 << 20))  # over the message limit: the connection is closed
        with pytest.raises(Exception, match="1009|message too big"):
            ws.recv(timeout=10)
    with OpenpiPolicy(server.url, timeout_s=10.0) as policy:
        assert policy.infer(_observation(tiny_policy.spec)).actions.shape == (16, 8)


def test_a_client_refuses_a_server_that_serves_another_policy():
    with OpenpiServer(EchoPolicy(), port=0) as first:
        first.start()
        port = first.port
        policy = OpenpiPolicy(first.url, timeout_s=10.0)
        assert policy.infer(_observation(BENCH_SPEC)).actions.shape == (50, 8)
    # Another policy takes the port over: the connection is gone, then the pinned client
    # refuses the newcomer.
    with OpenpiServer(EchoPolicy(replace(BENCH_SPEC, chunk_len=12)), port=port) as second:
        second.start()
        with pytest.raises(RemoteUnavailable):
            policy.infer(_observation(BENCH_SPEC))
        with pytest.raises(RemoteRejected, match="not the pinned"):
            policy.infer(_observation(BENCH_SPEC))


def test_serve_refuses_open_openpi_servers(tmp_path):
    assert serve_cli.serve_main(["--protocol", "openpi", "--bind", "ws://0.0.0.0:8011"]) == 2
    assert serve_cli.serve_main(["--protocol", "openpi", "--bind", "tcp://127.0.0.1:8011"]) == 2
    assert serve_cli.serve_main(["--protocol", "openpi", "--curve-keys", str(tmp_path)]) == 2
    assert serve_cli.serve_main(["--protocol", "openpi", "--tls-cert", "c.pem"]) == 2
    keys = tmp_path / "api_keys"
    keys.write_text("arm1 short\n")
    assert serve_cli.serve_main(["--protocol", "openpi", "--api-keys", str(keys)]) == 2


def test_packed_matches_openpis_msgpack_numpy():
    message = {
        "actions": np.arange(12, dtype=np.float32).reshape(3, 4),
        "image": np.zeros((2, 2, 3), np.uint8),
        "scalar": np.float64(2.5),
        "prompt": "hi",
    }
    ours = packed.unpack(msgpack_numpy.packb(message))
    theirs = msgpack_numpy.unpackb(packed.pack(message))
    for decoded in (ours, theirs):
        np.testing.assert_array_equal(decoded["actions"], message["actions"])
        assert decoded["image"].dtype == np.uint8 and decoded["prompt"] == "hi"
        assert decoded["scalar"] == 2.5
