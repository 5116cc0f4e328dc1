"""Framing between the judge and candidate workers: JSON headers plus raw array bytes.

Nothing from a worker is ever unpickled: the candidate runs there, so whatever it writes to the pipe
must not be able to run code in the judge.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import ml_dtypes
import numpy as np

ALLOWED_DTYPES = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bfloat16",
}
MAX_FRAME_BYTES = 8 << 30


class WireError(Exception):
    """A malformed message: a protocol bug or a hostile worker."""


def _dtype(name: str) -> np.dtype:
    if name not in ALLOWED_DTYPES:
        raise WireError(f"array dtype {name!r} not allowed on the wire")
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _encode(obj: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(obj, np.ndarray) or (hasattr(obj, "__array__") and hasattr(obj, "dtype") and hasattr(obj, "shape")):
        # Not ``np.ascontiguousarray``: it returns at least one dimension, so a 0-d output (a loss's
        # mean) would arrive as shape (1,) and fail the judge's shape check.
        arr = np.asarray(obj, order="C")
        arrays.append(arr)
        return {"__array__": len(arrays) - 1, "dtype": str(arr.dtype), "shape": list(arr.shape)}
    if isinstance(obj, dict):
        return {"__dict__": [[k, _encode(v, arrays)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"__tuple__" if isinstance(obj, tuple) else "__list__": [_encode(v, arrays) for v in obj]}
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise WireError(f"cannot send {type(obj).__name__}")


def _decode(obj: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(obj, dict):
        if "__array__" in obj:
            return arrays[int(obj["__array__"])]
        if "__dict__" in obj:
            return {str(k): _decode(v, arrays) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(_decode(v, arrays) for v in obj["__tuple__"])
        if "__list__" in obj:
            return [_decode(v, arrays) for v in obj["__list__"]]
        raise WireError("unknown object in message")
    if isinstance(obj, list):
        raise WireError("bare list in message")
    return obj


def send(conn: "Connection | Duplex", obj: Any) -> None:
    arrays: list[np.ndarray] = []
    header = _encode(obj, arrays)
    specs = [{"dtype": str(a.dtype), "shape": list(a.shape)} for a in arrays]
    conn.send_bytes(json.dumps({"body": header, "arrays": specs}).encode())
    for arr in arrays:
        conn.send_bytes(arr.tobytes())


def recv(conn: "Connection | Duplex") -> Any:
    try:
        header = json.loads(conn.recv_bytes(MAX_FRAME_BYTES).decode())
        specs = header["arrays"]
        arrays: list[np.ndarray] = []
        for spec in specs:
            dtype = _dtype(str(spec["dtype"]))
            shape = tuple(int(s) for s in spec["shape"])
            raw = conn.recv_bytes(MAX_FRAME_BYTES)
            count = int(np.prod(shape)) if shape else 1
            if len(raw) != count * dtype.itemsize:
                raise WireError("array payload does not match its declared shape")
            arrays.append(np.frombuffer(raw, dtype=dtype).reshape(shape).copy())
        return _decode(header["body"], arrays)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise WireError(f"malformed message: {exc}") from exc


@dataclass
class Duplex:
    """Two one-way pipe ends used as one connection (each side holds a read end and a write end)."""

    rx: Connection
    tx: Connection

    def send_bytes(self, data: bytes) -> None:
        self.tx.send_bytes(data)

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        return self.rx.recv_bytes(maxlength)

    def poll(self, timeout: float = 0.0) -> bool:
        return self.rx.poll(timeout)

    def close(self) -> None:
        for end in (self.rx, self.tx):
            try:
                end.close()
            except OSError:
                pass
