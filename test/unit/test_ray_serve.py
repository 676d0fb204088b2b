"""Fleet serving on a local Ray cluster: 2 replicas behind Ray's HTTP proxy, RayClient robots."""

import copy
import http.client
import socket
import threading
import time

import pytest

ray = pytest.importorskip("ray")

import numpy as np  # noqa: E402

from vla_runtime.core.threads import limit_threads  # noqa: E402
from vla_runtime.engine.checkpoint import random_checkpoint  # noqa: E402
from vla_runtime.engine.policy import Observation  # noqa: E402
from vla_runtime.engine.remote import packed, ray_serve, wire  # noqa: E402
from vla_runtime.engine.remote.protocol import RemoteError, RemoteRejected  # noqa: E402
from vla_runtime.engine.remote.ray_client import RayClient  # noqa: E402
from vla_runtime.engine.torch_backend import TorchPolicy  # noqa: E402

limit_threads(1)
ROBOTS = [f"robot{i}" for i in range(10)]


def token(robot: str) -> str:
    return f"{robot}-secret-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = condition()
            if result:
                return result
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout_s} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tokens = tmp_path_factory.mktemp("fleet") / "tokens"
    tokens.write_text("".join(f"{r} {token(r)}\n" for r in ROBOTS))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        url = ray_serve.deploy(
            replicas=2,
            threads=1,
            max_batch_size=8,
            batch_wait_timeout_s=0.01,
            port=free_port(),
            tokens_file=str(tokens),
        )
        wait_for(lambda: RayClient(url, ROBOTS[0], token(ROBOTS[0]), 5.0).spec, what="serve up")
        yield url
    finally:
        ray_serve.shutdown()
        ray.shutdown()


def observation(spec, seed: int, stamp: float = 1.0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {
        c.name: rng.integers(0, 256, (c.height, c.width, 3), dtype=np.uint8) for c in spec.cameras
    }
    state = rng.normal(size=spec.state_dim).astype(np.float32)
    return Observation(images, state, "pick up the red cube", stamp)


def client(url, robot: str, **kwargs) -> RayClient:
    return RayClient(url, robot, token(robot), timeout_s=30.0, **kwargs)


def test_two_robots_get_the_policys_chunks(url):
    local = TorchPolicy(random_checkpoint("tiny", 0), seed=0)
    for i, robot in enumerate(ROBOTS[:2]):
        with client(url, robot) as remote:
            assert remote.spec == local.spec
            obs = observation(remote.spec, i)
            chunk = remote.infer(obs)
            session = copy.copy(local)
            session.reset()
            session.reseed(0)  # what the server's fresh session of this robot holds
            expected = session.infer(obs)
            assert chunk.actions.shape == (local.spec.chunk_len, local.spec.action_dim)
            np.testing.assert_allclose(chunk.actions, expected.actions, atol=2e-4, rtol=1e-4)
            assert chunk.stamp == obs.stamp and chunk.info["server_infer_ms"] > 0


def test_robot_sticks_to_one_replica(url):
    seen = {}
    for robot in ROBOTS[2:6]:
        with client(url, robot) as remote:
            replicas = set()
            for k in range(4):
                remote.infer(observation(remote.spec, k, stamp=float(k)))
                replicas.add(remote.last_replica)
            assert len(replicas) == 1, f"{robot} moved between replicas {replicas}"
            seen[robot] = replicas.pop()
    assert all(seen.values())


def test_concurrent_robots_are_batched(url):
    sizes, errors = [], []
    barrier = threading.Barrier(8)

    def run(robot):
        try:
            with client(url, robot) as remote:
                spec = remote.spec
                barrier.wait(timeout=30)
                for k in range(6):
                    chunk = remote.infer(observation(spec, k, stamp=float(k)))
                    sizes.append(chunk.info["batch_size"])
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in ROBOTS[:8]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(sizes) == 48 and max(sizes) > 1


def test_wrong_or_missing_token_is_refused(url):
    with pytest.raises(RemoteRejected, match="token"):
        RayClient(url, "robot0", "not-a-known-token-000000", timeout_s=10.0)
    with pytest.raises(RemoteRejected, match="token"):
        RayClient(url, "robot0", None, timeout_s=10.0)


def test_a_robot_cannot_claim_another_robots_session(url):
    # robot9's token routed as robot0 (the proxy's session header) is refused.
    with pytest.raises(RemoteError, match="must name the robot"):
        RayClient(url, "robot0", token("robot9"), timeout_s=30.0)
    remote = RayClient(url, "robot9", token("robot9"), timeout_s=30.0)
    assert remote.infer(observation(remote.spec, 0)).actions.shape[0] == remote.spec.chunk_len


class TamperedClient(RayClient):
    """A reply altered after the server sent it: the client's checks must refuse it."""

    tamper = None

    def _request(self, body):
        reply = super()._request(body)
        if body["op"] == "infer" and reply.get("ok"):
            self.tamper(reply)
        return reply


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda r: r.update(actions=r["actions"][:-1]), "shape"),
        (lambda r: r.update(actions=np.full_like(r["actions"], np.nan)), "non-finite"),
        (lambda r: r.update(stamp=r["stamp"] + 1.0), "another observation"),
        (lambda r: r.update(actions=r["actions"].astype(np.int32)), "float"),
    ],
)
def test_reply_failing_checks_is_refused(url, tamper, message):
    remote = TamperedClient(url, "robot7", token("robot7"), timeout_s=30.0)
    remote.tamper = tamper
    with pytest.raises(RemoteError, match=message):
        remote.infer(observation(remote.spec, 0))


def test_other_policy_is_refused_after_pinning(url):
    with pytest.raises(RemoteRejected, match="pinned"):
        client(url, "robot8", expected_spec_hash="0" * 16)


def test_oversized_body_refused_before_reading(url):
    host, port = url.split("//")[1].rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/")
    conn.putheader("Authorization", f"Bearer {token('robot0')}")
    conn.putheader("Content-Length", str(wire.MAX_MESSAGE_BYTES + 1))
    conn.endheaders()  # no body sent: refused on its announced length alone
    response = conn.getresponse()
    assert response.status == 413
    assert packed.unpack(response.read())["kind"] == "too_large"
    conn.close()
