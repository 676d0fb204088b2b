"""The remote protocol's message bodies and errors, shared by server and client."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine.policy import Observation, PolicyError, PolicySpec
from vla_runtime.engine.remote import wire

DEFAULT_BIND = "tcp://127.0.0.1:5555"
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"


class RemoteError(RuntimeError):
    """Base class of remote back-end failures."""


class RemoteUnavailable(RemoteError):
    """No answer in time: the server is down, overloaded, or (CURVE) the keys do not match."""


class RemoteRejected(RemoteError):
    """The server refused the session (protocol version, policy spec, robot not authorised), or
    it is not the server this client pinned."""


class RemoteOverloaded(RemoteError):
    """The server's queue was full: the request was not run."""


def spec_hash(spec: dict) -> str:
    """A short fingerprint of a policy spec (its canonical JSON), pinned by clients."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def pinned(previous: str | None, served: str, endpoint: str) -> str:
    """Trust on first use: the server identity to keep (`served` the first time); a server that
    later serves something else is refused (RemoteRejected)."""
    if previous is not None and served != previous:
        raise RemoteRejected(
            f"{endpoint} now serves {served}, not the pinned {previous}: refusing it"
        )
    return served


def ok_reply(request_id, **body) -> dict:
    return {"v": wire.PROTOCOL_VERSION, "id": request_id, "ok": True, **body}


def error_reply(request_id, kind: str, message: str) -> dict:
    """One line of at most 300 characters: nothing more of the server reaches a client."""
    line = (message.splitlines() or [""])[0][:300]
    return {"v": wire.PROTOCOL_VERSION, "id": request_id, "ok": False, "kind": kind, "error": line}


def version_refusal(request: dict) -> dict:
    """The reply to a request of another protocol version."""
    return error_reply(
        request.get("id"),
        "version",
        f"protocol version mismatch: client speaks v{str(request.get('v'))[:10]}, server speaks "
        f"v{wire.PROTOCOL_VERSION}; install the same vla_runtime on both ends",
    )


def mode_to_wire(mode: ComputeMode) -> dict:
    stable = None if mode.stable_cameras is None else sorted(mode.stable_cameras)
    return {
        "vision_level": mode.vision_level,
        "denoise_level": mode.denoise_level,
        "stable_cameras": stable,
    }


def mode_from_wire(raw: Any) -> ComputeMode:
    if not isinstance(raw, dict):
        raise TypeError(f"compute mode must be a map, got {type(raw).__name__}")
    stable = raw.get("stable_cameras")
    return ComputeMode(
        raw.get("vision_level", 0),
        raw.get("denoise_level", 0),
        None if stable is None else frozenset(str(name) for name in stable),
    )


def float_map(values: dict) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            continue  # diagnostics only; never fail a chunk over an odd info value
    return out


def spec_mismatch(expected: Any, served: dict) -> str:
    """Human-readable list of differing fields ('' when equal)."""
    if not isinstance(expected, dict):
        return f"expected spec must be a map, got {type(expected).__name__}"
    try:
        expected = PolicySpec.from_dict(expected).to_dict()
    except Exception as exc:
        return f"unreadable expected spec: {exc}"
    diffs = [
        f"{key}: {expected.get(key)!r} vs {served.get(key)!r}"
        for key in sorted(set(expected) | set(served))
        if _normalise(expected.get(key)) != _normalise(served.get(key))
    ]
    return "; ".join(diffs)


def _normalise(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


def parse_infer(request: dict, instruction: str) -> tuple[Observation, ComputeMode, Any]:
    """(observation, compute mode, plan or None) of an infer request; `instruction` is the
    session's, unless the request carries a new one. Raises PolicyError for what the policy
    would refuse, KeyError / TypeError / ValueError (ComputeModeError) for a malformed request."""
    if "instruction" in request:
        instruction = request["instruction"]
        if not isinstance(instruction, str):
            raise TypeError("instruction must be a string")
    images = request["images"]
    if not isinstance(images, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in images.items()
    ):
        raise PolicyError("images must map camera names to arrays")
    state = request["state"]
    if not isinstance(state, np.ndarray):
        raise PolicyError("state must be an array")
    plan = request.get("plan")
    if plan is not None and not isinstance(plan, np.ndarray):
        raise PolicyError("plan must be an array or absent")
    mode = mode_from_wire(request.get("mode", {}))
    stamp = request.get("stamp", 0.0)
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not np.isfinite(stamp):
        raise ValueError("stamp must be a finite number")
    return Observation(images, state, instruction, float(stamp)), mode, plan
