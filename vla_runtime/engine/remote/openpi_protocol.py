"""The openpi websocket protocol as both our ends speak it (`serve --protocol openpi` and the
engine's `openpi` back end).

openpi's `WebsocketPolicyServer` sends one metadata map when a client connects, then answers
each observation map with an action map (`actions`: (H, A) array, `server_timing`); an error is
a text frame instead. All messages are msgpack with arrays in openpi's layout (`packed`).
Observation keys are a policy's own convention (openpi's DROID example: `observation/
exterior_image_1_left`, `observation/joint_position`, `prompt`); ours are `observation/<camera>`,
`observation/state` and `prompt`, listed in the metadata. When both ends are vla_runtime, the
metadata carries our policy spec under `vla_runtime` and requests may add the `vla_runtime/*`
keys (observation stamp, compute mode, plan); other openpi servers ignore unknown keys.
"""

from __future__ import annotations

PROTOCOL = "vla_runtime-openpi/1"
DEFAULT_PORT = 8000
STATE_KEY = "observation/state"
PROMPT_KEY = "prompt"
ACTIONS_KEY = "actions"
STAMP_KEY = "vla_runtime/stamp"
MODE_KEY = "vla_runtime/mode"
PLAN_KEY = "vla_runtime/plan"
METADATA_KEY = "vla_runtime"  # {protocol, spec, spec_hash} in the metadata of our server
ERROR_KINDS = ("bad_request", "policy", "overloaded", "internal")


def image_key(camera: str) -> str:
    return f"observation/{camera}"


def error_text(kind: str, message: str) -> str:
    """An error frame: `kind: first line of the message` (at most 300 characters)."""
    return f"{kind}: {(message.splitlines() or [''])[0][:300]}"


def parse_error(text: str) -> tuple[str, str]:
    """(kind, message) of an error frame; kind "server" for one from another openpi server
    (openpi sends its traceback)."""
    kind, _, message = text.partition(": ")
    if kind in ERROR_KINDS:
        return kind, message
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "server", (lines[-1] if lines else "empty error")[:300]
