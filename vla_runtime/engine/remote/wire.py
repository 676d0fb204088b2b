"""Wire format of the remote back end: one msgpack header frame + one raw frame per array.

A message is a list of ZeroMQ frames `[header, array_0, array_1, ...]`. The header is a msgpack
map; every numpy array inside it is replaced by a small placeholder `{"__nd__": i, "dtype",
"shape"}` and its bytes travel as frame i+1 untouched, so large images are neither copied into
msgpack nor base64-encoded. Frames are sent with `copy=False` (the array's memory is handed to
libzmq) and decoded with `np.frombuffer` over the received frame (a view, no copy).

Only plain numeric dtypes cross the wire: a peer can never make us build object arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

# Bump whenever the header layout or message semantics change; peers must match exactly.
PROTOCOL_VERSION = 1

_ND_KEY = "__nd__"
_ALLOWED_KINDS = frozenset("biufc")  # bool, int, uint, float, complex
_MAX_NDIM = 8


class WireError(ValueError):
    """A message that cannot be decoded: malformed header, bad array frame, wrong version."""


def encode(header: dict[str, Any]) -> list[Any]:
    """Turn `header` (which may hold numpy arrays at any depth) into frames for send_multipart.

    Arrays are referenced, not copied (contiguous ones); do not modify them until sent."""

    buffers: list[memoryview] = []

    def replace(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind not in _ALLOWED_KINDS:
                raise WireError(f"cannot send arrays of dtype {obj.dtype}")
            arr = obj if obj.flags.c_contiguous else obj.copy(order="C")
            buffers.append(memoryview(arr).cast("B") if arr.size else memoryview(b""))
            return {_ND_KEY: len(buffers) - 1, "dtype": arr.dtype.str, "shape": list(arr.shape)}
        if isinstance(obj, dict):
            return {key: replace(value) for key, value in obj.items()}
        if isinstance(obj, list | tuple):
            return [replace(value) for value in obj]
        if isinstance(obj, np.generic):
            return obj.item()
        return obj

    packed = msgpack.packb(replace(header), use_bin_type=True)
    return [packed, *buffers]


def decode(frames: Sequence[Any]) -> dict[str, Any]:
    """Inverse of `encode`. `frames` may be bytes or zmq.Frame objects (received copy=False);
    arrays come back as views over the frames' memory (read-only for bytes frames)."""

    if not frames:
        raise WireError("empty message")
    views = [_as_view(frame) for frame in frames]
    try:
        header = msgpack.unpackb(views[0], raw=False, strict_map_key=False)
    except Exception as exc:
        raise WireError(f"undecodable header: {exc}") from exc
    if not isinstance(header, dict):
        raise WireError(f"header must be a map, got {type(header).__name__}")
    used: set[int] = set()

    def restore(obj: Any) -> Any:
        if isinstance(obj, dict):
            if _ND_KEY in obj:
                return _array_from(obj, views, used)
            return {key: restore(value) for key, value in obj.items()}
        if isinstance(obj, list):
            return [restore(value) for value in obj]
        return obj

    result = restore(header)
    if len(used) != len(views) - 1:
        raise WireError(f"{len(views) - 1} array frames sent but {len(used)} referenced")
    return result


def _as_view(frame: Any) -> memoryview:
    buffer = getattr(frame, "buffer", frame)  # zmq.Frame exposes its memory as .buffer
    return memoryview(buffer).cast("B") if not isinstance(buffer, bytes) else memoryview(buffer)


def _array_from(ref: dict, views: list[memoryview], used: set[int]) -> np.ndarray:
    try:
        index = int(ref[_ND_KEY])
        dtype = np.dtype(str(ref["dtype"]))
        shape = tuple(int(n) for n in ref["shape"])
    except Exception as exc:
        raise WireError(f"bad array placeholder {ref!r}: {exc}") from exc
    if dtype.kind not in _ALLOWED_KINDS:
        raise WireError(f"refusing array of dtype {dtype}")
    if not 0 <= index < len(views) - 1:
        raise WireError(f"array frame {index} missing ({len(views) - 1} sent)")
    if index in used:
        raise WireError(f"array frame {index} referenced twice")
    if len(shape) > _MAX_NDIM or any(n < 0 for n in shape):
        raise WireError(f"bad array shape {shape}")
    view = views[index + 1]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if view.nbytes != expected:
        raise WireError(
            f"array frame {index}: {view.nbytes} bytes, expected {expected} for {dtype} {shape}"
        )
    used.add(index)
    return np.frombuffer(view, dtype=dtype).reshape(shape)
