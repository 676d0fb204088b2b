"""The policy server against hostile or broken peers, and the client against hostile servers:
real sockets on loopback; the attacked server runs in its own process so its memory is its own."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from test_remote import SlowPolicy, _free_port, load_tiny_policy, make_observation

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine.policy import ActionChunk
from vla_runtime.engine.remote import client as remote_client
from vla_runtime.engine.remote import protocol, wire
from vla_runtime.engine.remote import server as remote_server
from vla_runtime.engine.remote.sessions import ServerLimits

REPO = Path(__file__).resolve().parents[2]
RSS_SLACK_MIB = 50
HUGE = [2**62, 2**62, 16]  # bytes: a product that overflows 64 bits to 0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _send_raw(endpoint: str, frames: list, wait_s: float = 10.0, identity: bytes | None = None):
    """Send `frames` from a fresh socket; the decoded reply, or None when none came."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    try:
        sock.connect(endpoint)
        sock.send_multipart(frames)
        if not sock.poll(int(wait_s * 1e3)):
            return None
        return wire.decode(sock.recv_multipart())
    finally:
        sock.close()


def _header(body: dict) -> bytes:
    return msgpack.packb({"v": wire.PROTOCOL_VERSION, "id": 7, **body})


@pytest.fixture(scope="module")
def served():
    """A `vla-runtime serve` process (tiny torch policy, 16 sessions at most) and its endpoint."""
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "vla_runtime.engine.remote.serve_cli", "--backend", "torch",
         "--preset", "tiny", "--bind", endpoint, "--max-sessions", "16", "--threads", "1"],
        cwd=REPO, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    client = remote_client.RemoteClient(endpoint, timeout_s=2.0, connect=False, robot="honest")
    deadline = time.monotonic() + 120
    while True:
        try:
            client.infer(make_observation(client.spec))
            break
        except protocol.RemoteUnavailable:
            assert process.poll() is None and time.monotonic() < deadline, "server did not start"
    client.timeout_s = 30.0
    yield process, endpoint, client
    client.close()
    process.terminate()
    process.wait(timeout=20)


def _honest_round(client) -> None:
    obs = make_observation(client.spec, 3)
    assert client.infer(obs).actions.shape == (client.spec.chunk_len, client.spec.action_dim)


def test_attacks_leave_memory_bounded_and_honest_clients_served(served):
    process, endpoint, honest = served
    _honest_round(honest)
    baseline = _rss_mib(process.pid)
    big = np.zeros(16 << 20, np.uint8).tobytes()
    attacks = {
        # 48 MiB in three frames: refused by its size, each frame dropped as it arrives.
        "oversize message": [_header({"op": "hello"}), big, big, big],
        "too many frames": [_header({"op": "hello"})] + [b"\0"] * 40,
        "header over its limit": [msgpack.packb([{}] * (4 << 20))],
        "deep header": [b"\x81" + msgpack.packb("x") + b"\x91" * 900 + b"\xc0"],
        "wide map": [msgpack.packb({str(i): i for i in range(10_000)})],
        "long string": [_header({"op": "hello", "robot": "r" * 100_000})],
        "complex array": [
            _header({"op": "infer", "state": {"__nd__": 0, "dtype": "<c8", "shape": [8]}}),
            b"\0" * 64,
        ],
        "big-endian array": [
            _header({"op": "infer", "state": {"__nd__": 0, "dtype": ">f4", "shape": [8]}}),
            b"\0" * 32,
        ],
        "overflowing shape": [
            _header(
                {"op": "infer", "state": {"__nd__": 0, "dtype": "<f4", "shape": [2**62, 2**62, 16]}}
            ),  # fmt: skip
            b"\0" * 16,
        ],
    }
    for name, frames in attacks.items():
        reply = _send_raw(endpoint, frames)
        assert reply is not None, name
        assert reply["ok"] is False and reply["kind"] == "bad_request", (name, reply)
        assert "\n" not in reply["error"] and "Traceback" not in reply["error"], name
        _honest_round(honest)
    # A frame over the socket's limit: libzmq drops that peer, no answer.
    assert _send_raw(endpoint, [_header({"op": "hello"}), big * 3], wait_s=2.0) is None
    # Many identities, each opening a session: at most --max-sessions are kept.
    for i in range(200):
        reply = _send_raw(endpoint, [_header({"op": "hello", "robot": f"squatter{i}"})])
        assert reply["ok"], reply
    _honest_round(honest)  # evicted by then, it says hello again and is served
    assert process.poll() is None
    grown = _rss_mib(process.pid) - baseline
    assert grown < RSS_SLACK_MIB, f"server grew by {grown:.0f} MiB"


def test_a_reconnecting_robot_keeps_one_session():
    policy = load_tiny_policy()
    with remote_server.PolicyServer(policy, "tcp://127.0.0.1:*") as server:
        server.start()
        client = remote_client.RemoteClient(server.endpoint, timeout_s=30, robot="arm1")
        obs = make_observation(client.spec)
        for _ in range(5):
            client.infer(obs)
            client._drop_transport()  # as after a timeout: a new socket, a new identity
        client.close()
        assert server.client_count == 1
        assert list(server._sessions) == ["arm1"]


def test_a_full_queue_answers_overloaded_at_once():
    policy = load_tiny_policy()
    limits = ServerLimits(max_queue=1)
    with remote_server.PolicyServer(SlowPolicy(policy, 0.5), "tcp://127.0.0.1:*",
                                    limits=limits) as server:  # fmt: skip
        server.start()
        clients = [remote_client.RemoteClient(server.endpoint, timeout_s=30, robot=f"r{i}")
                   for i in range(4)]  # fmt: skip
        obs = make_observation(policy.spec, instruction="slow")
        outcomes: list = []

        def ask(client):
            try:
                outcomes.append(client.infer(obs))
            except protocol.RemoteOverloaded as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=ask, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        served = [o for o in outcomes if isinstance(o, ActionChunk)]
        overloaded = [o for o in outcomes if isinstance(o, protocol.RemoteOverloaded)]
        assert len(outcomes) == 4 and served and overloaded
        assert server.counters["overloaded"] == len(overloaded)
        for chunk in served:
            assert chunk.info["server_queue_ms"] >= 0 and chunk.info["server_infer_ms"] >= 400
        for client in clients:
            client.close()


class _LeakyPolicy:
    def __init__(self, spec):
        self.spec = spec

    def infer(self, observation, compute_mode=ComputeMode(), plan=None, noise_scale=None):
        raise RuntimeError("cannot open /srv/models/secret_weights.bin")


def test_internal_errors_reach_the_client_without_their_text():
    spec = load_tiny_policy().spec
    with remote_server.PolicyServer(_LeakyPolicy(spec), "tcp://127.0.0.1:*") as server:
        server.start()
        with remote_client.RemoteClient(server.endpoint, timeout_s=30) as client:
            with pytest.raises(protocol.RemoteError) as caught:
                client.infer(make_observation(spec))
    assert "secret" not in str(caught.value) and "server log #1" in str(caught.value)


def test_bad_compute_modes_and_stamps_are_bad_requests():
    policy = load_tiny_policy()
    with remote_server.PolicyServer(policy, "tcp://127.0.0.1:*") as server:
        server.start()
        with remote_client.RemoteClient(server.endpoint, timeout_s=30) as client:
            obs = make_observation(client.spec)
            request = client._infer_request(obs, ComputeMode(), None)
            for mode in ({"vision_level": float("inf")}, {"vision_level": 9}, "v1d1", [1]):
                reply = client._request({**request, "mode": mode})
                assert reply["kind"] == "bad_request", mode
            reply = client._request({**request, "stamp": float("nan")})
            assert reply["kind"] == "bad_request"
            assert client.infer(obs).stamp == obs.stamp  # and it goes on serving


# --- the client against a hostile server -----------------------------------------------------


class _FakeServer:
    """A ROUTER that answers hello with `spec` and each infer with `answer(request)`."""

    def __init__(self, spec_dict: dict, answer, endpoint: str | None = None):
        self.spec_dict, self.answer = spec_dict, answer
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.linger = 0
        if endpoint is None:
            endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        else:
            self.sock.bind(endpoint)
        self.endpoint = endpoint
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            identity, *frames = self.sock.recv_multipart()
            request = wire.decode(frames)
            if request["op"] == "hello":
                reply = protocol.ok_reply(request["id"], spec=self.spec_dict)
            else:
                reply = self.answer(request)
            self.sock.send_multipart([identity, *wire.encode(reply)])

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _chunk_reply(request, actions, **overrides):
    body = dict(actions=actions, stamp=request["stamp"], mode={}, timing_ms={"infer": 1.0})
    return protocol.ok_reply(request["id"], **{**body, **overrides})


@pytest.mark.parametrize(
    "answer, refusal",
    [
        (lambda r, a: _chunk_reply(r, a[:-1]), "shape"),
        (lambda r, a: _chunk_reply(r, np.where(a == a, np.nan, a)), "non-finite"),
        (lambda r, a: _chunk_reply(r, a.astype(np.int32)), "float"),
        (lambda r, a: _chunk_reply(r, a, stamp=r["stamp"] - 1.0), "stamp"),
        (lambda r, a: _chunk_reply(r, a, timing_ms="x"), "refused"),
    ],
)
def test_client_refuses_replies_that_fail_its_checks(answer, refusal):
    spec = load_tiny_policy().spec
    actions = np.zeros((spec.chunk_len, spec.action_dim), np.float32)
    fake = _FakeServer(spec.to_dict(), lambda request: answer(request, actions))
    try:
        with remote_client.RemoteClient(fake.endpoint, timeout_s=10) as client:
            with pytest.raises(protocol.RemoteError, match=refusal):
                client.infer(make_observation(spec))
    finally:
        fake.close()


def test_client_ignores_replies_addressed_to_nobody():
    spec = load_tiny_policy().spec
    actions = np.zeros((spec.chunk_len, spec.action_dim), np.float32)
    fake = _FakeServer(spec.to_dict(), lambda r: {**_chunk_reply(r, actions), "id": None})
    try:
        with remote_client.RemoteClient(fake.endpoint, timeout_s=1.0) as client:
            with pytest.raises(protocol.RemoteUnavailable):
                client.infer(make_observation(spec))
    finally:
        fake.close()


def test_client_pins_the_first_servers_policy():
    policy = load_tiny_policy()
    spec = policy.spec
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    with remote_server.PolicyServer(policy, endpoint) as server:
        server.start()
        client = remote_client.RemoteClient(endpoint, timeout_s=2.0)
        pinned = client.pinned_spec_hash
        assert pinned == server.spec_hash
    # Another process takes the port over and serves another policy.
    other = {**spec.to_dict(), "chunk_len": spec.chunk_len + 4}
    fake = _FakeServer(other, lambda r: protocol.error_reply(r["id"], "handshake_required", ""),
                       endpoint)  # fmt: skip
    try:
        with pytest.raises(protocol.RemoteRejected, match="pinned"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    client.infer(make_observation(spec))
                except protocol.RemoteUnavailable:
                    continue
    finally:
        client.close()
        fake.close()
