"""A push's checks on the server's hot path (pushpull/server/server.py, keystate.py): the dtype is compared
by its header code, and a round completes on its last push, exactly summed."""
from __future__ import annotations

import numpy as np
import pytest

from pushpull.server.keystate import KeyState
from pushpull.server.server import Server
from pushpull.transport.protocol import Flags, Header, Msg, MsgType, ProtocolError, dtype_code


def _push(dtype_code_: int, numel: int, body: bytes, sender: int = 1) -> Msg:
    return Msg(Header(MsgType.PUSH, sender=sender, key=7, round=1, dtype=dtype_code_, numel=numel,
                      nbytes=len(body), flags=Flags.PULL | Flags.NO_ACK), [body])


def test_a_push_of_another_dtype_is_refused_naming_the_tensor_and_both_dtypes():
    ks = KeyState(7, "metric.loss", "float32", 1, 2)
    with pytest.raises(ProtocolError, match=r"tensor 'metric.loss': rank 1 pushed int32\[1\], the tensor is "
                                            r"float32\[1\]"):
        Server._decode_push(None, _push(dtype_code("int32"), 1, b"\0" * 4), ks)


def test_a_push_with_an_unknown_dtype_code_is_refused_as_such():
    ks = KeyState(7, "metric.loss", "float32", 1, 2)
    with pytest.raises(ProtocolError, match="unknown dtype code 99"):
        Server._decode_push(None, _push(99, 1, b"\0" * 4), ks)


def test_a_one_element_int64_round_sums_exactly_on_its_last_push():
    ks = KeyState(7, "metric.count", "int64", 1, 2)
    big = 2 ** 62 + 1  # beyond float64's 53 bits: any float detour would round it
    first = Server._decode_push(None, _push(dtype_code("int64"), 1, np.array([big], np.int64).tobytes(), 0), ks)
    assert ks.push(1, 0, first) is None
    second = Server._decode_push(None, _push(dtype_code("int64"), 1, np.array([-3], np.int64).tobytes()), ks)
    done = ks.push(1, 1, second)
    assert done is not None and done.out.dtype == np.int64 and int(done.out[0]) == big - 3
