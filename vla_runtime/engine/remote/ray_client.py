"""`RayClient`: the `Policy` protocol against a Ray Serve deployment (`remote/ray_serve.py`).

Standard library only (http.client, one keep-alive connection), so a robot needs no Ray.
"""

from __future__ import annotations

import http.client
import ssl
import time
from urllib.parse import urlsplit

from vla_runtime.engine.policy import PolicySpec
from vla_runtime.engine.remote import packed, wire
from vla_runtime.engine.remote.client import SessionClient
from vla_runtime.engine.remote.keys import check_robot_name
from vla_runtime.engine.remote.protocol import (
    RemoteError,
    RemoteOverloaded,
    RemoteRejected,
    RemoteUnavailable,
)
from vla_runtime.engine.remote.ray_serve import SESSION_HEADER

DEFAULT_URL = "http://127.0.0.1:8000/"
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class RayClient(SessionClient):
    """A `Policy` whose infer() runs on a Ray Serve replica, as robot `robot`.

    `token`: the robot's bearer token (the server's API-key file). `verify`: with https, True
    checks the server against the system CAs, a path against that CA file (a self-signed
    fleet CA); there is no unverified mode. Every request waits at most `timeout_s`; on a
    failure the connection is closed and the next call opens a new one (and says hello again).
    Session, trust on first use and reply checks: `SessionClient`."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        robot: str | None = None,
        token: str | None = None,
        timeout_s: float = 2.0,
        expected_spec: PolicySpec | None = None,
        expected_spec_hash: str | None = None,
        connect: bool = True,
        verify: bool | str = True,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host:port/, got {url!r}")
        if verify is False:
            raise ValueError("verify: True (system CAs) or a CA file; unverified TLS is refused")
        super().__init__(url, robot, timeout_s, expected_spec, expected_spec_hash)
        check_robot_name(self.robot)
        self._host, self._path = parts.hostname, parts.path or "/"
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = None
        if parts.scheme == "https":
            self._tls = ssl.create_default_context(
                cafile=verify if isinstance(verify, str) else None
            )
        self._headers = {"Content-Type": "application/msgpack", "Connection": "keep-alive"}
        self._headers[SESSION_HEADER] = self.robot  # Ray's proxy routes the robot by it
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None
        self.last_replica: str | None = None  # the replica that answered last
        if connect:
            self._connect_now()

    @property
    def url(self) -> str:
        return self.endpoint

    def _request(self, body: dict) -> dict:
        request_id = next(self._ids)
        data = packed.pack({"v": wire.PROTOCOL_VERSION, "id": request_id, "robot": self.robot,
                            **body})  # fmt: skip
        started = time.perf_counter()
        raw = self._post(data)
        try:
            reply = packed.unpack(raw)
        except wire.WireError as exc:
            self._drop_transport()
            raise RemoteError(f"malformed reply from {self.url}: {exc}") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self._drop_transport()
            raise RemoteError(f"malformed reply from {self.url}: not a reply map")
        if reply.get("v") != wire.PROTOCOL_VERSION:
            self._drop_transport()
            raise RemoteRejected(
                f"protocol version mismatch: server speaks v{str(reply.get('v'))[:10]}, client "
                f"speaks v{wire.PROTOCOL_VERSION}; install the same vla_runtime on both ends"
            )
        # Errors refused before the body was read answer no id; anything else must be ours.
        if reply.get("id") != request_id and not (not reply["ok"] and reply.get("id") is None):
            self._drop_transport()
            raise RemoteError(f"reply from {self.url} answers request {reply.get('id')!r}")
        self.last_round_trip_ms = (time.perf_counter() - started) * 1e3
        replica = reply.get("replica")
        self.last_replica = replica if isinstance(replica, str) else None
        return reply

    def _post(self, data: bytes) -> bytes:
        """POST `data`, return the reply body; a keep-alive connection the server closed while
        idle is reopened once."""
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._connection()
            try:
                conn.request("POST", self._path, body=data, headers=self._headers)
                response = conn.getresponse()
                length = response.getheader("Content-Length")
                if length is not None and (
                    not length.isdigit() or int(length) > wire.MAX_MESSAGE_BYTES
                ):
                    raise RemoteError(f"reply from {self.url} over {wire.MAX_MESSAGE_BYTES} bytes")
                raw = response.read(wire.MAX_MESSAGE_BYTES + 1)
                if response.getheader("Content-Type", "") != "application/msgpack":
                    if response.status == 503:  # Ray's proxy: the replica's queue is full
                        raise RemoteOverloaded(f"{self.url} is overloaded (HTTP 503)")
                    raise RemoteError(
                        f"{self.url} answered HTTP {response.status} without a policy reply"
                    )
                if response.will_close:
                    self._drop_transport()
                return raw
            except _STALE:
                self._drop_transport()
                if attempt or not reused:
                    raise RemoteUnavailable(f"{self.url} closed the connection") from None
            except (TimeoutError, OSError, http.client.HTTPException) as exc:
                self._drop_transport()
                raise RemoteUnavailable(
                    f"no reply from {self.url} within {self.timeout_s:g} s "
                    f"({wire.first_line(exc)}); reconnecting on the next call"
                ) from None
            except RemoteError:
                self._drop_transport()
                raise
        raise AssertionError("unreachable")

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._tls is not None:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout_s, context=self._tls
                )
            else:
                self._conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=self.timeout_s
                )
        return self._conn

    def _drop_transport(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
