"""CURVE keys for the remote back end, API-key files of the websocket and HTTP servers, and which
endpoints count as loopback (no keys needed).

A key directory holds the server's pair (`server.key`, `server.key_secret`), the allow-list
`authorized_clients/` (one public `<robot>.key` per robot) and, per robot, the bundle to copy
onto it (`robots/<robot>/`: the server's public key and the robot's own pair, the layout
`load_client_keys` reads). The allow-list is the whole truth: a robot whose key is not there,
or an empty list, is refused; revoking a robot removes its key, and a running server drops it
within a second.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import re
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import zmq.auth

log = logging.getLogger(__name__)

SERVER_KEY_NAME = "server"
CLIENT_KEY_NAME = "client"
AUTHORIZED_CLIENTS_DIR = "authorized_clients"
ROBOTS_DIR = "robots"
RELOAD_S = 1.0  # how often servers look at their allow-lists and key files
ROBOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def is_loopback(endpoint: str) -> bool:
    """True when `endpoint` can only be reached from this host (loopback tcp, ipc, inproc)."""
    transport, _, address = endpoint.partition("://")
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp":
        return False
    return is_loopback_host(address.rsplit(":", 1)[0])


def is_loopback_host(host: str) -> bool:
    """True when a server bound to `host` can only be reached from this host."""
    host = host.strip("[]")
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', '0.0.0.0', interface names, host names: reachable from outside
        return False


def check_robot_name(name: str) -> str:
    if not ROBOT_NAME.fullmatch(name or ""):
        raise ValueError(f"robot name {name!r}: 1-64 letters, digits, '_', '.' or '-'")
    return name


def generate_keys(directory: str | Path) -> Path:
    """Write the server's CURVE key pair under `directory` with an empty allow-list (nobody
    may connect until `add_robot`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(directory, SERVER_KEY_NAME)
    (directory / AUTHORIZED_CLIENTS_DIR).mkdir(exist_ok=True)
    (directory / SERVER_KEY_NAME).with_suffix(".key_secret").chmod(0o600)
    return directory


def add_robot(directory: str | Path, name: str) -> Path:
    """A key pair of its own for robot `name`, authorised on the server. Returns the bundle
    directory to copy onto the robot (engine parameter `curve_keys`)."""
    directory, name = Path(directory), check_robot_name(name)
    server_public = directory / f"{SERVER_KEY_NAME}.key"
    if not server_public.is_file():
        raise FileNotFoundError(
            f"no {server_public}: create keys with `vla-runtime serve --gen-keys DIR` first"
        )
    allowed = directory / AUTHORIZED_CLIENTS_DIR / f"{name}.key"
    if allowed.exists():
        raise FileExistsError(f"robot {name!r} already has a key; revoke it first to replace it")
    bundle = directory / ROBOTS_DIR / name
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    public, secret = zmq.auth.create_certificates(bundle, CLIENT_KEY_NAME)
    Path(secret).chmod(0o600)
    shutil.copy(server_public, bundle / server_public.name)
    allowed.parent.mkdir(exist_ok=True)
    shutil.copy(public, allowed)
    return bundle


def revoke_robot(directory: str | Path, name: str) -> bool:
    """Remove robot `name` from the allow-list (and its bundle). False: it had no key."""
    directory, name = Path(directory), check_robot_name(name)
    allowed = directory / AUTHORIZED_CLIENTS_DIR / f"{name}.key"
    shutil.rmtree(directory / ROBOTS_DIR / name, ignore_errors=True)
    if not allowed.exists():
        return False
    allowed.unlink()
    return True


def load_server_keys(directory: str | Path) -> tuple[bytes, Path]:
    """(server secret key, allow-list directory) from a `generate_keys` directory."""
    directory = Path(directory)
    path = directory / f"{SERVER_KEY_NAME}.key_secret"
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: create keys with `vla-runtime serve --gen-keys DIR`")
    _, secret = zmq.auth.load_certificate(path)
    return secret, directory / AUTHORIZED_CLIENTS_DIR


def allowed_robots(allow_list: str | Path) -> dict[str, str]:
    """{client public key (z85), robot name} of every key in the allow-list directory."""
    robots = {}
    for path in sorted(Path(allow_list).glob("*.key")):
        try:
            public, _ = zmq.auth.load_certificate(path)
        except (OSError, ValueError):
            continue
        robots[public.decode("ascii")] = path.stem  # certificates hold z85 text
    return robots


def load_client_keys(directory: str | Path) -> tuple[bytes, tuple[bytes, bytes]]:
    """(server public key, (client public, client secret)) from a robot's bundle."""
    directory = Path(directory)
    server_public, _ = zmq.auth.load_certificate(directory / f"{SERVER_KEY_NAME}.key")
    client_public, client_secret = zmq.auth.load_certificate(
        directory / f"{CLIENT_KEY_NAME}.key_secret"
    )
    return server_public, (client_public, client_secret)


def load_api_keys(path: str | Path) -> dict[str, str]:
    """{key, robot name} from an API-key file (websocket and HTTP servers): one `ROBOT KEY`
    per line, `#` comments. Keys shorter than 16 characters are refused (guessable)."""
    keys: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected `ROBOT KEY`")
        robot, key = check_robot_name(fields[0]), fields[1]
        if len(key) < 16:
            raise ValueError(f"{path}:{number}: key of robot {robot} shorter than 16 characters")
        if key in keys:
            raise ValueError(f"{path}:{number}: key of robot {robot} is already {keys[key]}'s")
        keys[key] = robot
    return keys


def check_exposure(host: str, tls_cert, tls_key, api_keys) -> None:
    """The websocket and HTTP servers neither encrypt nor authenticate by themselves: off
    loopback they need a TLS certificate and key and an API-key file."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    if not is_loopback_host(host) and not (tls_cert and api_keys):
        raise ValueError(
            f"refusing to serve on {host} without TLS and authentication: anything but loopback "
            "needs --tls-cert, --tls-key and --api-keys FILE (one `ROBOT KEY` per line), or "
            "serve on 127.0.0.1"
        )


class FileWatch:
    """Whether some files changed (names, modification times, sizes), asked at most once per
    `period_s`: servers re-read their allow-lists and key files without a restart. The first
    question is always answered yes."""

    def __init__(self, files: Callable[[], Iterable[Path]], period_s: float = RELOAD_S):
        self._files, self.period_s = files, period_s
        self._signature: tuple | None = None
        self._checked = -math.inf

    def changed(self) -> bool:
        now = time.monotonic()
        if now - self._checked < self.period_s:
            return False
        self._checked = now
        signature = []
        for path in sorted(self._files()):
            try:
                stat = path.stat()
            except OSError:  # removed between listing and reading
                continue
            signature.append((path.name, stat.st_mtime_ns, stat.st_size))
        if tuple(signature) == self._signature:
            return False
        self._signature = tuple(signature)
        return True


class ApiKeyStore:
    """An API-key file (`load_api_keys`), re-read (at most once a second) when it changes, so
    a robot removed from it is refused on its next request. A missing or unreadable file
    refuses everyone. Keys come in `Authorization: <scheme> <key>` headers."""

    def __init__(self, path: str | Path | None, scheme: str):
        self.path = Path(path) if path else None
        self.scheme = scheme.lower()
        self._tokens: dict[str, str] = {}
        self._watch = FileWatch(lambda: [self.path] if self.path else [])
        self._reload()
        if not self._tokens:
            log.warning("no robot keys in %s: every request is refused", self.path)

    def _reload(self) -> None:
        if not self._watch.changed():
            return
        try:
            exists = self.path is not None and self.path.exists()
            self._tokens = load_api_keys(self.path) if exists else {}
        except (OSError, ValueError) as exc:
            log.error("API-key file refused, every request is refused until fixed: %s", exc)
            self._tokens = {}

    def robot_for(self, authorization: str | None) -> str | None:
        """The robot of an `Authorization` header value, or None."""
        self._reload()
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != self.scheme or not token.strip():
            return None
        presented = token.strip().encode()
        robot = None
        for known, name in self._tokens.items():  # compare with every token: constant time
            if hmac.compare_digest(presented, known.encode()):
                robot = name
        return robot
