"""CURVE keys for the remote back end, and which endpoints count as loopback (no keys needed)."""

from __future__ import annotations

import ipaddress
import shutil
from pathlib import Path

import zmq.auth

SERVER_KEY_NAME = "server"
CLIENT_KEY_NAME = "client"
AUTHORIZED_CLIENTS_DIR = "authorized_clients"


def is_loopback(endpoint: str) -> bool:
    """True when `endpoint` can only be reached from this host (loopback tcp, ipc, inproc)."""
    transport, _, address = endpoint.partition("://")
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp":
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', interface names, host names: may be reachable from outside
        return False


def generate_keys(directory: str | Path) -> Path:
    """Write a server and a client CURVE key pair under `directory` and authorise the client.

    Give robots `server.key` (public) and `client.key_secret`; keep `server.key_secret` on the
    server. More robots: drop their public `*.key` files into `authorized_clients/`."""

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(directory, SERVER_KEY_NAME)
    client_public, _ = zmq.auth.create_certificates(directory, CLIENT_KEY_NAME)
    allowed = directory / AUTHORIZED_CLIENTS_DIR
    allowed.mkdir(exist_ok=True)
    shutil.copy(client_public, allowed / Path(client_public).name)
    for secret in directory.glob("*.key_secret"):
        secret.chmod(0o600)
    return directory


def load_server_keys(directory: str | Path) -> tuple[bytes, Path | None]:
    """(server secret key, allow-list directory or None) from a `generate_keys` directory."""

    directory = Path(directory)
    path = directory / f"{SERVER_KEY_NAME}.key_secret"
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: create keys with `vla-runtime serve --gen-keys DIR`")
    _, secret = zmq.auth.load_certificate(path)
    allowed = directory / AUTHORIZED_CLIENTS_DIR
    return secret, (allowed if allowed.is_dir() and any(allowed.glob("*.key")) else None)


def load_client_keys(directory: str | Path) -> tuple[bytes, tuple[bytes, bytes]]:
    """(server public key, (client public, client secret)) from a `generate_keys` directory."""

    directory = Path(directory)
    server_public, _ = zmq.auth.load_certificate(directory / f"{SERVER_KEY_NAME}.key")
    client_public, client_secret = zmq.auth.load_certificate(
        directory / f"{CLIENT_KEY_NAME}.key_secret"
    )
    return server_public, (client_public, client_secret)
