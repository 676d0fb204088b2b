"""Wire format of the remote back end: one msgpack header frame + one raw frame per array.

A message is a list of ZeroMQ frames `[header, array_0, array_1, ...]`. The header is a msgpack
map; every numpy array inside it is replaced by a small placeholder `{"__nd__": i, "dtype",
"shape"}` and its bytes travel as frame i+1 untouched, so large images are neither copied into
msgpack nor base64-encoded. Frames are sent with `copy=False` (the array's memory is handed to
libzmq) and decoded with `np.frombuffer` over the received frame (a view, no copy).

Decoding trusts nothing: the whole message, the frame count, the header's size, every string,
map and list in it and its nesting depth are bounded before or while it is unpacked (a small
header can otherwise unpack into a thousand times its size in Python objects), and arrays are
little-endian bool, integer or float of at most `MAX_NDIM` dimensions whose byte count must
match their frame exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

# Bump whenever the header layout or message semantics change; peers must match exactly.
PROTOCOL_VERSION = 2

MAX_MESSAGE_BYTES = 32 << 20  # all frames of one message together
MAX_FRAMES = 16  # the header and up to 15 arrays
MAX_HEADER_BYTES = 64 << 10
MAX_STR_LEN = 4096  # an instruction is a sentence
MAX_CONTAINER_LEN = 64  # entries of any map or list in a header
MAX_DEPTH = 6  # nesting of maps and lists in a header
MAX_NDIM = 8

_ND_KEY = "__nd__"
# Little-endian (or byte-order-free) plain numbers only: complex would lose its imaginary part
# on the way to the policy, and a big-endian array would be read as garbage.
ALLOWED_DTYPES = frozenset(
    np.dtype(name).newbyteorder("<").str
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
)


class WireError(ValueError):
    """A message that cannot be decoded: malformed header, bad array frame, over a limit."""


def encode(header: dict[str, Any]) -> list[Any]:
    """Turn `header` (which may hold numpy arrays at any depth) into frames for send_multipart.

    Arrays are referenced, not copied (contiguous little-endian ones); do not modify them until
    sent."""

    buffers: list[memoryview] = []

    def replace(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            arr = obj.astype(obj.dtype.newbyteorder("<"), copy=False)
            if arr.dtype.str not in ALLOWED_DTYPES:
                raise WireError(f"cannot send arrays of dtype {obj.dtype}")
            arr = arr if arr.flags.c_contiguous else arr.copy(order="C")
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


def check_size(frame_sizes: Sequence[int]) -> None:
    """Refuse a message by its frames' sizes alone, before anything in it is read."""
    if not frame_sizes:
        raise WireError("empty message")
    if len(frame_sizes) > MAX_FRAMES:
        raise WireError(f"{len(frame_sizes)} frames, at most {MAX_FRAMES}")
    if frame_sizes[0] > MAX_HEADER_BYTES:
        raise WireError(f"header of {frame_sizes[0]} bytes, at most {MAX_HEADER_BYTES}")
    total = sum(frame_sizes)
    if total > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {total} bytes, at most {MAX_MESSAGE_BYTES}")


def decode(frames: Sequence[Any]) -> dict[str, Any]:
    """Inverse of `encode`. `frames` may be bytes or zmq.Frame objects (received copy=False);
    arrays come back as views over the frames' memory (read-only for bytes frames)."""

    views = [_as_view(frame) for frame in frames]
    check_size([view.nbytes for view in views])
    try:
        header = msgpack.unpackb(
            views[0],
            raw=False,
            max_str_len=MAX_STR_LEN,
            max_bin_len=MAX_STR_LEN,
            max_array_len=MAX_CONTAINER_LEN,
            max_map_len=MAX_CONTAINER_LEN,
            max_ext_len=0,
        )
    except Exception as exc:
        raise WireError(f"undecodable header: {first_line(exc)}") from None
    if not isinstance(header, dict):
        raise WireError(f"header must be a map, got {type(header).__name__}")
    check_depth(header)
    used: set[int] = set()

    def restore(obj: Any) -> Any:  # recursion bounded by MAX_DEPTH, checked above
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


def check_depth(header: dict) -> None:
    """Nesting of maps and lists at most MAX_DEPTH, walked without recursion."""
    stack: list[tuple[Any, int]] = [(header, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise WireError(f"header nested deeper than {MAX_DEPTH} levels")
        children = obj.values() if isinstance(obj, dict) else obj
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def _as_view(frame: Any) -> memoryview:
    buffer = getattr(frame, "buffer", frame)  # zmq.Frame exposes its memory as .buffer
    return memoryview(buffer).cast("B") if not isinstance(buffer, bytes) else memoryview(buffer)


def _array_from(ref: dict, views: list[memoryview], used: set[int]) -> np.ndarray:
    index, dtype, shape = ref.get(_ND_KEY), ref.get("dtype"), ref.get("shape")
    if not (isinstance(index, int) and isinstance(dtype, str) and isinstance(shape, list)):
        raise WireError(f"bad array placeholder {str(ref)[:200]}")
    if dtype not in ALLOWED_DTYPES:
        raise WireError(
            f"refusing array of dtype {dtype[:20]!r}: little-endian bool, integer or float only"
        )
    if not 0 <= index < len(views) - 1:
        raise WireError(f"array frame {index} missing ({len(views) - 1} sent)")
    if index in used:
        raise WireError(f"array frame {index} referenced twice")
    if len(shape) > MAX_NDIM or not all(type(n) is int and n >= 0 for n in shape):
        raise WireError(f"bad array shape {str(shape)[:100]}")
    view = views[index + 1]
    expected = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: cannot overflow
    if view.nbytes != expected:
        raise WireError(
            f"array frame {index}: {view.nbytes} bytes, expected {expected} for {dtype} "
            f"{tuple(shape)}"
        )
    used.add(index)
    return np.frombuffer(view, dtype=dtype).reshape(shape)
