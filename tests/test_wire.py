from multiprocessing import Pipe

import ml_dtypes
import numpy as np
import pytest

from jaxbench import wire


def test_round_trip_nested_arrays_and_scalars():
    a, b = Pipe()
    msg = {"x": (np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(2, ml_dtypes.bfloat16)), "n": None, "k": [1, "s"]}
    wire.send(a, msg)
    got = wire.recv(b)
    np.testing.assert_array_equal(got["x"][0], msg["x"][0])
    assert got["x"][1].dtype == ml_dtypes.bfloat16
    assert got["n"] is None and got["k"] == [1, "s"]


def test_hostile_frames_are_refused_not_unpickled():
    a, b = Pipe()
    a.send_bytes(b'{"body": {"__array__": 0}, "arrays": [{"dtype": "object", "shape": [1]}]}')
    a.send_bytes(b"\x00" * 8)
    with pytest.raises(wire.WireError):
        wire.recv(b)
    a.send_bytes(b"\x80\x04\x95 not json")
    with pytest.raises(wire.WireError):
        wire.recv(b)


def test_payload_size_must_match_declared_shape():
    a, b = Pipe()
    a.send_bytes(b'{"body": {"__array__": 0}, "arrays": [{"dtype": "float32", "shape": [4]}]}')
    a.send_bytes(b"\x00" * 8)
    with pytest.raises(wire.WireError):
        wire.recv(b)


def test_zero_d_and_strided_arrays_keep_their_shape():
    """A 0-d array (a loss's mean, a temperature input) or NumPy scalar stays 0-d, and a transposed view
    arrives with its own shape and values."""
    a, b = Pipe()
    scalar = np.asarray(np.float32(2.5))
    strided = np.arange(6, dtype=np.int32).reshape(2, 3).T
    wire.send(a, (scalar, strided, np.bool_(True)))
    got_scalar, got_strided, flag = wire.recv(b)
    assert got_scalar.shape == () and got_scalar.dtype == np.float32 and float(got_scalar) == 2.5
    assert got_strided.shape == (3, 2)
    np.testing.assert_array_equal(got_strided, strided)
    assert flag.shape == () and flag.dtype == np.bool_ and bool(flag)
