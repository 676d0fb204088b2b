"""Wire framing of the remote back end: round trips, zero-copy frames, rejected input."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

from vla_runtime.engine.remote import wire

HUGE = [2**62, 2**62]  # elements: a byte count that overflows 64 bits

ARRAYS = {
    "image": np.arange(224 * 224 * 3, dtype=np.uint8).reshape(224, 224, 3),
    "state": np.linspace(-1, 1, 8, dtype=np.float32),
    "f64": np.array([[1.5, -2.25], [3.0, np.inf]]),
    "i64": np.array([-(2**40), 7], dtype=np.int64),
    "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
    "bool": np.array([True, False, True]),
    "half": np.array([0.5, 1.0], dtype=np.float16),
    "scalar": np.array(3.25),
    "empty": np.zeros((0, 7), dtype=np.float32),
    "strided": np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2],
}


def test_round_trip_preserves_dtype_shape_and_values():
    header = {"op": "x", "nested": {"arrays": dict(ARRAYS)}, "list": [ARRAYS["state"], 4, "s"]}
    decoded = wire.decode(wire.encode(header))
    assert decoded["op"] == "x"
    for name, original in ARRAYS.items():
        got = decoded["nested"]["arrays"][name]
        assert got.dtype == original.dtype.newbyteorder("<"), name  # sent little-endian
        assert got.shape == original.shape, name
        np.testing.assert_array_equal(got, original)
    np.testing.assert_array_equal(decoded["list"][0], ARRAYS["state"])
    assert decoded["list"][1:] == [4, "s"]


def test_contiguous_arrays_are_sent_without_copy():
    image = ARRAYS["image"]
    frames = wire.encode({"image": image})
    assert len(frames) == 2
    # The array frame is a view of the array's own memory, not a copy.
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.uint8), image)
    # The image bytes are not inside the msgpack header.
    assert len(frames[0]) < 100


def test_decoded_arrays_view_the_received_frames_over_zmq():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        a.send_multipart(wire.encode({"image": ARRAYS["image"]}), copy=False)
        assert b.poll(5000)
        frames = b.recv_multipart(copy=False)
        image = wire.decode(frames)["image"]
        np.testing.assert_array_equal(image, ARRAYS["image"])
        assert np.shares_memory(image, np.frombuffer(frames[1].buffer, dtype=np.uint8))
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_object_and_complex_arrays_are_refused_on_both_ends():
    with pytest.raises(wire.WireError, match="dtype"):
        wire.encode({"x": np.array(["a", None], dtype=object)})
    with pytest.raises(wire.WireError, match="dtype"):
        wire.encode({"x": np.array([1 + 2j])})
    header = msgpack.packb({"x": {"__nd__": 0, "dtype": "|O", "shape": [1]}})
    with pytest.raises(wire.WireError, match="dtype"):
        wire.decode([header, b"\0" * 8])


@pytest.mark.parametrize(
    "frames, message",
    [
        ([], "empty"),
        ([b"\xc1garbage"], "undecodable"),
        ([msgpack.packb([1, 2])], "must be a map"),
        ([msgpack.packb({"x": {"__nd__": 0, "dtype": "<f4", "shape": [3]}})], "missing"),
        (
            [msgpack.packb({"x": {"__nd__": 0, "dtype": "<f4", "shape": [3]}}), b"\0" * 8],
            "expected 12",
        ),
        ([msgpack.packb({"x": {"__nd__": 0, "dtype": "<f4", "shape": [-1]}}), b""], "shape"),
        ([msgpack.packb({"x": 1}), b"extra"], "referenced"),
        (
            [
                msgpack.packb(
                    {
                        "x": {"__nd__": 0, "dtype": "|u1", "shape": [1]},
                        "y": {"__nd__": 0, "dtype": "|u1", "shape": [1]},
                    }
                ),
                b"\1",
            ],
            "twice",
        ),
        ([msgpack.packb({"x": {"__nd__": 0, "dtype": "nope", "shape": [1]}}), b"\1"], "dtype"),
        ([msgpack.packb({"x": {"__nd__": 0, "dtype": ">f4", "shape": [1]}}), b"\0" * 4], "dtype"),
        ([msgpack.packb({"x": {"__nd__": 0, "dtype": "<c8", "shape": [1]}}), b"\0" * 8], "dtype"),
        ([msgpack.packb({"x": {"__nd__": 0, "dtype": "<f4", "shape": HUGE}}), b""], "expected"),
        ([msgpack.packb({"x": {"__nd__": 0, "dtype": "<f4", "shape": [True]}}), b"\0"], "shape"),
        ([b"\x81\xa1x" + b"\x91" * (wire.MAX_DEPTH + 1) + b"\xc0"], "deeper"),
        ([msgpack.packb({"x": list(range(wire.MAX_CONTAINER_LEN + 1))})], "undecodable"),
        ([msgpack.packb({"x": "s" * (wire.MAX_STR_LEN + 1)})], "undecodable"),
        ([msgpack.packb({"x": "s" * wire.MAX_HEADER_BYTES})], "header of"),
        ([msgpack.packb({})] + [b""] * wire.MAX_FRAMES, "frames"),
    ],
)
def test_malformed_messages_raise_wire_error(frames, message):
    with pytest.raises(wire.WireError, match=message):
        wire.decode(frames)


def test_whole_message_size_is_refused_before_reading():
    wire.check_size([100, wire.MAX_MESSAGE_BYTES - 100])
    with pytest.raises(wire.WireError, match="message of"):
        wire.check_size([100, wire.MAX_MESSAGE_BYTES])
