"""One-buffer messages (websocket, HTTP bodies): msgpack with numpy arrays inline, in the layout
openpi's `msgpack_numpy` uses (`{b"__ndarray__": True, b"data", b"dtype", b"shape"}`), so
`openpi-client` and openpi policy servers read what we write and we read what they write.

Decoding trusts nothing, with the limits of `wire`: the message's size, every string, binary,
map and list and the nesting depth are bounded while it is unpacked, and arrays are
little-endian bool, integer or float whose byte count matches their shape exactly (openpi's own
decoder accepts any dtype and any size).
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from vla_runtime.engine.remote import wire
from vla_runtime.engine.remote.wire import WireError

MAX_ARRAY_BYTES = wire.MAX_MESSAGE_BYTES
_ND, _NPGENERIC = b"__ndarray__", b"__npgeneric__"


def pack(obj: Any) -> bytes:
    """`obj` (maps, lists, numbers, strings, numpy arrays and scalars) -> one msgpack buffer."""
    return msgpack.packb(obj, default=_pack_numpy, use_bin_type=True)


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """Inverse of `pack` (and of openpi's `msgpack_numpy.packb`), within the limits above."""
    if len(data) > wire.MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes, at most {wire.MAX_MESSAGE_BYTES}")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            max_str_len=wire.MAX_STR_LEN,
            max_bin_len=MAX_ARRAY_BYTES,
            max_array_len=wire.MAX_CONTAINER_LEN,
            max_map_len=wire.MAX_CONTAINER_LEN,
            max_ext_len=0,
            strict_map_key=False,  # openpi's array maps have bytes keys
        )
    except Exception as exc:
        raise WireError(f"undecodable message: {wire.first_line(exc)}") from None
    if isinstance(obj, dict | list):
        wire.check_depth(obj if isinstance(obj, dict) else {"": obj})
    return _restore(obj)


def _pack_numpy(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = obj.astype(obj.dtype.newbyteorder("<"), copy=False)
        if arr.dtype.str not in wire.ALLOWED_DTYPES:
            raise WireError(f"cannot send arrays of dtype {obj.dtype}")
        return {_ND: True, b"data": np.ascontiguousarray(arr).tobytes(), b"dtype": arr.dtype.str,
                b"shape": list(arr.shape)}  # fmt: skip
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot pack {type(obj).__name__}")


def _restore(obj: Any) -> Any:  # recursion bounded by wire.MAX_DEPTH, checked above
    if isinstance(obj, dict):
        if _ND in obj:
            return _array_from(obj)
        if _NPGENERIC in obj:
            return _scalar_from(obj)
        return {key: _restore(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_restore(value) for value in obj]
    return obj


def _array_from(ref: dict) -> np.ndarray:
    data, dtype, shape = ref.get(b"data"), ref.get(b"dtype"), ref.get(b"shape")
    if not (isinstance(data, bytes) and isinstance(dtype, str) and isinstance(shape, list)):
        raise WireError("bad array: needs bytes data, a dtype string and a shape list")
    _check_dtype(dtype)
    if len(shape) > wire.MAX_NDIM or not all(type(n) is int and n >= 0 for n in shape):
        raise WireError(f"bad array shape {str(shape)[:100]}")
    expected = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: cannot overflow
    if len(data) != expected:
        raise WireError(f"array of {len(data)} bytes, expected {expected} for {dtype} {shape}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _scalar_from(ref: dict) -> Any:
    dtype, value = ref.get(b"dtype"), ref.get(b"data")
    if not isinstance(dtype, str) or not isinstance(value, bool | int | float):
        raise WireError("bad numpy scalar")
    _check_dtype(dtype)
    return np.dtype(dtype).type(value)


def _check_dtype(dtype: str) -> None:
    if dtype not in wire.ALLOWED_DTYPES:
        raise WireError(
            f"refusing array of dtype {dtype[:20]!r}: little-endian bool, integer or float only"
        )
