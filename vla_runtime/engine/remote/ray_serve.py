"""Fleet serving on Ray Serve (`vla-runtime serve --engine ray`, extra `vla_runtime[fleet]`).

One deployment, `PolicyReplica` (N replicas, each with its own copy of the policy), behind
Ray's HTTP proxy; each replica checks size, bearer token and robot itself (`HttpFront`). The
proxy routes by robot with Ray Serve's consistent-hash request router (session id = the robot,
from the `x-session-id` header; no fallback replica), so a robot's per-robot session (KV caches,
previous chunk, RNG) lives on one replica. Full-compute requests without a plan are gathered
with `@serve.batch` across robots and run as one batched forward (`infer_batch`); every other
mode runs on the robot's session.

Replies carry the ZeroMQ server's fields (`protocol.ok_reply` / `error_reply`) plus `replica`.
Ray's HTTP proxy has no authentication of its own: off loopback, TLS and an API-key file
(bearer tokens, `keys.load_api_keys`) are both required. `ray` is imported inside functions
only: `import vla_runtime` never needs it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeModeError
from vla_runtime.core.threads import limit_threads
from vla_runtime.engine.batch import infer_batch, infer_one
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import PolicyError
from vla_runtime.engine.remote import packed, wire
from vla_runtime.engine.remote.keys import ROBOT_NAME, ApiKeyStore, check_exposure
from vla_runtime.engine.remote.protocol import (
    error_reply,
    float_map,
    mode_to_wire,
    ok_reply,
    parse_infer,
    spec_hash,
    version_refusal,
)
from vla_runtime.engine.remote.sessions import ServerLimits, SessionTable, spec_refusal

log = logging.getLogger(__name__)

NOT_INSTALLED = "Ray Serve is not installed: pip install 'vla_runtime[fleet]'"
APP_NAME = "vla_policy"
ROUTER = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"
# The header Ray's proxy takes the session id from, the consistent-hash router's key (Ray's
# default; RAY_SERVE_SESSION_ID_HEADER_KEY changes it cluster-wide).
SESSION_HEADER = os.environ.get("RAY_SERVE_SESSION_ID_HEADER_KEY", "x-session-id").lower()
HTTP_STATUS = {"unauthorized": 401, "too_large": 413, "bad_request": 400, "overloaded": 503}


def import_serve():
    """`ray.serve`, or ImportError with the one-line install hint."""
    try:
        from ray import serve
    except ImportError:
        raise ImportError(NOT_INSTALLED) from None
    return serve


# -- the policy replica ------------------------------------------------------------------------


def _replica_id() -> str:
    serve = sys.modules.get("ray.serve")  # a replica has it loaded; elsewhere do not load it
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Ray Serve (unit tests, in-process use)
        return f"local-{os.getpid()}"


class PolicyReplica:
    """One copy of the policy and the sessions of the robots routed to it, as `PolicyServer`
    keeps them (shallow copy + reset + reseed per robot, LRU cap, idle expiry). Model compute
    is serialised (one forward at a time, `threads` torch threads) off the event loop, so
    requests keep arriving, and batching, while a forward runs. `max_batch_size` 1: unbatched."""

    def __init__(
        self,
        factory,
        seed: int = 0,
        threads: int = 1,
        limits: ServerLimits = ServerLimits(),
        max_batch_size: int = 8,
        batch_wait_timeout_s: float = 0.005,
        tokens_file: str | None = None,
        auth: bool = False,
    ):
        self.threads = limit_threads(threads)
        self._front = HttpFront(tokens_file, auth)
        self.policy = factory()
        self.limits, self._seed = limits, seed
        self._spec_dict = self.policy.spec.to_dict()
        self.spec_hash = spec_hash(self._spec_dict)
        self._sessions = SessionTable(self.policy, seed, limits)
        self._errors = itertools.count(1)
        self._compute = asyncio.Lock()
        self.replica_id = _replica_id()
        self._batch = None
        if max_batch_size > 1:
            self._batch = import_serve().batch(
                max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s
            )(self._full_batch)

    async def __call__(self, http_request):
        """The HTTP entry (Ray's proxy -> this replica): a `packed` reply, 200 or the error's
        status."""
        started = time.perf_counter()
        read = await self._front.read(
            http_request.method, http_request.headers, http_request.stream()
        )
        if isinstance(read, dict):
            reply = read
        else:
            decode_ms = (time.perf_counter() - started) * 1e3
            reply = await self.serve_request(*read)
            if reply.get("ok") and isinstance(reply.get("timing_ms"), dict):
                reply["timing_ms"] = {"decode": decode_ms, **reply["timing_ms"]}
        status = 200 if reply.get("ok") else HTTP_STATUS.get(reply.get("kind"), 200)
        from starlette.responses import Response  # comes with ray[serve]

        return Response(packed.pack(reply), status_code=status, media_type="application/msgpack")

    async def serve_request(self, robot: str, request: dict) -> dict:
        """One request of `robot` (authenticated by the front) -> its reply."""
        arrived = time.perf_counter()
        try:
            reply = await self._handle(robot, request, arrived)
        except Exception:  # never let one bad request take the replica down, nor tell why
            ref = next(self._errors)
            log.exception("internal error #%d on a request from %s", ref, robot)
            reply = error_reply(
                request.get("id") if isinstance(request, dict) else None,
                "internal",
                f"internal server error (replica {self.replica_id} log #{ref})",
            )
        reply["replica"] = self.replica_id
        return reply

    async def _handle(self, robot: str, request: dict, arrived: float) -> dict:
        request_id = request.get("id")
        if request.get("v") != wire.PROTOCOL_VERSION:
            return version_refusal(request)
        self._sessions.expire()
        op = request.get("op")
        if op == "hello":
            return self._hello(robot, request)
        if op != "infer":
            return error_reply(request_id, "bad_request", f"unknown op {str(op)[:40]!r}")
        session = self._sessions.touch(robot)
        if session is None:
            return error_reply(request_id, "handshake_required", "unknown session: say hello")
        try:
            observation, mode, plan = parse_infer(request, session.instruction)
            if plan is not None and plan.size == 0:
                plan = None  # an empty plan constrains nothing (CachedPolicy ignores it too)
        except PolicyError as exc:
            return error_reply(request_id, "policy", str(exc))
        except (KeyError, TypeError, ValueError, ComputeModeError) as exc:
            return error_reply(request_id, "bad_request", f"malformed infer request: {exc}")
        session.instruction = observation.instruction
        full = mode.vision_level == 0 and mode.denoise_level == 0 and plan is None
        if full and self._batch is not None:
            chunk, started, infer_ms = await self._batch((session, observation))
        else:
            async with self._compute:
                started = time.perf_counter()
                chunk = await asyncio.to_thread(infer_one, session.policy, observation, mode, plan)
                infer_ms = (time.perf_counter() - started) * 1e3
        if isinstance(chunk, PolicyError):
            return error_reply(request_id, "policy", str(chunk))
        applied = mode if chunk.mode == FULL_COMPUTE and full else chunk.mode
        return ok_reply(
            request_id,
            actions=np.asarray(chunk.actions, dtype=np.float32),
            stamp=float(chunk.stamp),
            mode=mode_to_wire(applied),
            policy_timings_ms=float_map(chunk.timings_ms),
            info=float_map(chunk.info),
            timing_ms={"queue": (started - arrived) * 1e3, "infer": infer_ms},
        )

    async def _full_batch(self, items: list) -> list:
        """`@serve.batch` target: [(session, observation)] -> [(chunk | error, start, ms)]."""
        async with self._compute:
            started = time.perf_counter()
            # On the event loop, not in a thread: a forward in a thread starves the loop (GIL)
            # and requests trickle in one by one (batches of 1 measured); blocking it lets the
            # next batch queue up in full while this one runs.
            results = infer_batch(self.policy, [o for _, o in items], [s.policy for s, _ in items])
            infer_ms = (time.perf_counter() - started) * 1e3
        return [(result, started, infer_ms) for result in results]

    def _hello(self, robot: str, request: dict) -> dict:
        refusal = spec_refusal(request, self._spec_dict)
        if refusal is not None:
            return refusal
        self._sessions.open(robot)
        return ok_reply(request.get("id"), spec=self._spec_dict, spec_hash=self.spec_hash,
                        robot=robot, threads=self.threads)  # fmt: skip


# -- the HTTP front ----------------------------------------------------------------------------


class HttpFront:
    """What Ray's HTTP proxy does not do: size and token checked before the body is read,
    `packed` bodies, and the robot's identity. The proxy routes by the `x-session-id` header
    (the consistent-hash router's key), so the header must name the request's robot: a robot
    can neither reach another's session nor land on a replica that does not hold its own."""

    def __init__(self, tokens_file: str | None = None, auth: bool = False):
        self._tokens = ApiKeyStore(tokens_file, "Bearer") if auth else None

    async def read(self, method: str, headers, body_chunks) -> tuple[str, dict] | dict:
        """(robot, request), or the error reply to send instead."""
        if method != "POST":
            return error_reply(None, "bad_request", "POST a packed request")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > wire.MAX_MESSAGE_BYTES):
            return error_reply(None, "too_large", f"body over {wire.MAX_MESSAGE_BYTES} bytes")
        robot = None
        if self._tokens is not None:
            robot = self._tokens.robot_for(headers.get("authorization"))
            if robot is None:
                return error_reply(None, "unauthorized", "missing or unknown bearer token")
        body = bytearray()
        async for part in body_chunks:  # chunked bodies have no length: bound while reading
            body += part
            if len(body) > wire.MAX_MESSAGE_BYTES:
                return error_reply(None, "too_large", f"body over {wire.MAX_MESSAGE_BYTES} bytes")
        try:
            request = packed.unpack(bytes(body))
            if not isinstance(request, dict):
                raise wire.WireError("request must be a map")
        except wire.WireError as exc:
            return error_reply(None, "bad_request", str(exc))
        if robot is None:  # loopback without tokens: the robot names itself
            robot = request.get("robot")
            if not (isinstance(robot, str) and ROBOT_NAME.fullmatch(robot)):
                return error_reply(
                    request.get("id"), "bad_request", "robot: 1-64 letters, digits, '_', '.' or '-'"
                )
        if headers.get(SESSION_HEADER) != robot:
            return error_reply(
                request.get("id"), "bad_request", f"header {SESSION_HEADER} must name the robot"
            )
        return robot, request


# -- deployment and entry point ----------------------------------------------------------------


def deploy(
    checkpoint: str | None = None,
    preset: str = "tiny",
    backend: str = "torch",
    device: str = "cpu",
    seed: int = 0,
    threads: int = 1,
    replicas: int = 2,
    max_batch_size: int = 8,
    batch_wait_timeout_s: float = 0.005,
    host: str = "127.0.0.1",
    port: int = 8000,
    tokens_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    limits: ServerLimits = ServerLimits(),
    policy_factory=None,
    replica_cpus: float | None = None,
    ray_address: str | None = None,
) -> str:
    """Start Serve (HTTP on host:port, TLS when cert+key) and deploy the policy; returns the
    URL robots use. `policy_factory`: a picklable callable returning the policy (default:
    `load_policy` with the arguments above). Joins the running Ray cluster, or starts a local
    one (`ray_address`). Returns once the application is running."""
    check_exposure(host, tls_cert, tls_key, tokens_file)
    if replicas < 1 or max_batch_size < 1 or batch_wait_timeout_s < 0:
        raise ValueError("replicas and max_batch_size must be >= 1, batch_wait_timeout_s >= 0")
    serve = import_serve()
    import ray
    from ray.serve.config import RequestRouterConfig

    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False)
    factory = policy_factory or functools.partial(
        load_policy, backend, checkpoint, preset, device, seed, threads
    )
    http = {"host": host, "port": port}
    if tls_cert:
        http.update(
            ssl_certfile=str(Path(tls_cert).resolve()), ssl_keyfile=str(Path(tls_key).resolve())
        )
    serve.start(http_options=http)
    tokens = str(Path(tokens_file).resolve()) if tokens_file else None
    replica = serve.deployment(
        PolicyReplica,
        name="PolicyReplica",
        num_replicas=replicas,
        # Every robot may have a request in flight; beyond `max_queue` more waiting at the
        # proxy, it answers 503 (the client raises RemoteOverloaded).
        max_ongoing_requests=max(limits.max_sessions, max_batch_size),
        max_queued_requests=limits.max_queue,
        ray_actor_options={"num_cpus": threads if replica_cpus is None else replica_cpus},
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER,
            # No fallback: a robot's session exists on its replica only.
            request_router_kwargs={"num_fallback_replicas": 0},
        ),
    )
    app = replica.bind(
        factory, seed, threads, limits, max_batch_size, batch_wait_timeout_s, tokens,
        tokens is not None,
    )  # fmt: skip
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    scheme = "https" if tls_cert else "http"
    return f"{scheme}://{host}:{port}/"


def shutdown() -> None:
    """Remove the application and stop Serve (the Ray cluster keeps running)."""
    import_serve().shutdown()
