"""One dtype table (pushpull.dtypes): the ids on the wire are the ones every release has sent, and the
modules that used to keep their own tables read this one."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pushpull import dtypes

# the three numberings as they were on the wire before the tables were merged
HEADER_IDS = {"uint8": 0, "float16": 1, "bfloat16": 2, "float32": 3, "float64": 4, "int32": 5, "int64": 6,
              "int8": 7, "int16": 8}
PAYLOAD_IDS = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int64": 4, "int32": 5, "int16": 6,
               "int8": 7, "uint8": 8, "bool": 9}
SIG_ORDER = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
             "complex64", "complex128")


def test_header_ids_are_unchanged():
    assert {d.name: d.header for d in dtypes.DTYPES if d.header is not None} == HEADER_IDS


def test_payload_ids_are_unchanged():
    assert {d.name: d.payload for d in dtypes.DTYPES if d.payload is not None} == PAYLOAD_IDS


def test_signature_ids_are_unchanged():
    assert dtypes.SIG_NAMES == SIG_ORDER
    from pushpull.transport.protocol import describe_sig, round_sig
    assert describe_sig(round_sig(dtype="int8"))["dtype"] == "int8"
    assert (round_sig(dtype="int8") >> 16) & 31 == SIG_ORDER.index("int8") + 1


@pytest.mark.parametrize("d", dtypes.DTYPES, ids=lambda d: d.name)
def test_item_size_and_types_agree_with_torch_and_numpy(d):
    t = dtypes.to_torch(d.name)
    assert t.itemsize == d.itemsize and t.is_floating_point == d.floating
    assert dtypes.of_torch(t) is d and str(t) == "torch." + d.name
    assert np.dtype(d.np_wire).itemsize == d.itemsize


def test_the_protocol_and_the_payload_read_the_table():
    from pushpull.compression.base import _DTYPE_CODE
    from pushpull.transport.protocol import dtype_code, dtype_name
    for name, code in HEADER_IDS.items():
        assert dtype_code(name) == code and dtype_name(code) == name
    assert {str(t).replace("torch.", ""): c for t, c in _DTYPE_CODE.items()} == PAYLOAD_IDS


def test_push_pull_carries_exactly_the_dtypes_with_a_header_id():
    from pushpull.profiles import DTYPE_BYTES
    from pushpull.worker.engine import SUPPORTED
    assert {str(t).replace("torch.", "") for t in SUPPORTED} == set(HEADER_IDS) == set(DTYPE_BYTES)


def test_an_unknown_dtype_is_named():
    with pytest.raises(ValueError, match="float8"):
        dtypes.get("float8")
    with pytest.raises(ValueError, match="quint8"):
        dtypes.of_torch(torch.quint8)
