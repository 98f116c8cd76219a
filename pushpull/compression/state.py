"""A codec's state (:meth:`Codec.state_dict`) as bytes, for the wire: the servers' error feedback travels to the
workers at an elastic commit and back after a change (docs/elastic.md).

One frame: a 4-byte length, JSON (the numbers, the random streams' positions, and each tensor's name, dtype and
element count), then the tensors' bytes one after the other. JSON and raw bytes only: nothing on the wire is
turned into code, and a reader bounds what it accepts (:func:`unpack_state`'s ``numel``).
"""
from __future__ import annotations

import json
import struct

import torch

from pushpull import dtypes

_LEN = struct.Struct("<I")


def pack_state(state: dict) -> bytes:
    tensors, values = [], {}
    for name, v in state.items():
        if isinstance(v, torch.Tensor):
            t = v.detach().reshape(-1).contiguous().cpu()
            tensors.append((name, dtypes.of_torch(t.dtype).name, t.numel(), t))
        else:
            values[name] = v
    meta = json.dumps({"values": values, "tensors": [[n, d, k] for n, d, k, _ in tensors]}).encode()
    raw = [t.view(torch.uint8).numpy().tobytes() if t.numel() else b"" for *_, t in tensors]
    return b"".join([_LEN.pack(len(meta)), meta, *raw])


def unpack_state(buf, numel: int, dtype: str) -> dict:
    """The state in ``buf``; every tensor must be ``dtype``[``numel``] (the key's: a peer cannot make the reader
    allocate more than the key's size per tensor). ValueError names what is wrong."""
    view = memoryview(buf).cast("B")
    if len(view) < _LEN.size:
        raise ValueError("codec state: shorter than its length field")
    (n,) = _LEN.unpack(view[:_LEN.size])
    if _LEN.size + n > len(view):
        raise ValueError(f"codec state: {n} bytes of JSON announced, {len(view) - _LEN.size} there")
    try:
        meta = json.loads(bytes(view[_LEN.size:_LEN.size + n]))
        values, specs = dict(meta["values"]), list(meta["tensors"])
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise ValueError(f"codec state: unreadable JSON ({type(e).__name__})") from None
    out: dict = dict(values)
    at = _LEN.size + n
    itemsize = dtypes.itemsize(dtype)
    for spec in specs:
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str) and isinstance(spec[1], str)
                and type(spec[2]) is int):
            raise ValueError(f"codec state: bad tensor entry {str(spec)[:80]}")
        name, d, k = spec
        if d != dtype or k != numel:
            raise ValueError(f"codec state: tensor {name!r} is {d}[{k}], the key is {dtype}[{numel}]")
        if name in out:
            raise ValueError(f"codec state: {name!r} given twice")
        end = at + k * itemsize
        if end > len(view):
            raise ValueError(f"codec state: tensor {name!r} runs past the frame's end")
        out[name] = torch.frombuffer(bytearray(view[at:end]), dtype=torch.uint8).view(dtypes.to_torch(d)).clone() \
            if k else torch.empty(0, dtype=dtypes.to_torch(d))
        at = end
    if at != len(view):
        raise ValueError(f"codec state: {len(view) - at} bytes after the last tensor")
    return out
