"""The server's per-key summation and round bookkeeping, in isolation (the
integration tests in test_pushpull.py cover the same through real sockets)."""
import numpy as np
import pytest

from pushpull.server.keystate import KeyState, RoundError
from pushpull.server.reduce import Accumulator, WIRE_NP


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16", "uint8"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_accumulator_sums_in_wire_dtype(dtype, n):
    rng = np.random.default_rng(n)
    pushes = [rng.integers(0, 50, 1000).astype(WIRE_NP[dtype]) for _ in range(n)]
    keep = [p.copy() for p in pushes]
    acc = Accumulator(dtype, 1000)
    acc.first(pushes[0])
    for p in pushes[1:]:
        acc.add(p)
    got = acc.result()
    assert got.dtype == WIRE_NP[dtype]
    np.testing.assert_array_equal(got, np.sum(np.stack(keep).astype(np.float64), axis=0).astype(WIRE_NP[dtype]))
    for p, k in zip(pushes, keep):  # the pushes (views of received frames) are never written
        np.testing.assert_array_equal(p, k)


def test_accumulator_reused_across_rounds():
    acc = Accumulator("float32", 4)
    for rnd in range(3):
        a, b = np.full(4, rnd, np.float32), np.full(4, 10, np.float32)
        acc.first(a)
        acc.add(b)
        np.testing.assert_array_equal(acc.result(), np.full(4, rnd + 10, np.float32))
    acc.first(np.full(4, 7, np.float32))  # one worker: the push itself is the sum
    np.testing.assert_array_equal(acc.result(), np.full(4, 7, np.float32))
    acc.first(np.ones(4, np.float32))  # and the next round sums afresh, not onto the held push
    acc.add(np.ones(4, np.float32))
    np.testing.assert_array_equal(acc.result(), np.full(4, 2, np.float32))


def test_keystate_double_buffer_refuses_overwrite():
    ks = KeyState(1, "w", "float32", 3, num_workers=2)
    assert ks.push(1, 0, np.ones(3, np.float32)) is None
    slot = ks.push(1, 1, np.ones(3, np.float32))
    np.testing.assert_array_equal(slot.out, np.full(3, 2, np.float32))
    ks.push(2, 0, np.ones(3, np.float32))  # round 2 uses the other slot
    with pytest.raises(RoundError, match="rank 0 pushed round 3 while round 1 has not been pulled by rank"):
        ks.push(3, 0, np.ones(3, np.float32))
    with pytest.raises(RoundError, match="pushed twice"):
        ks.push(2, 0, np.ones(3, np.float32))


def test_a_key_with_writers_completes_with_their_pushes_and_refuses_others():
    # the local reduce's slice keys: 4 workers, ranks 1 and 3 (local rank 1 of each machine) push this one
    ks = KeyState(1, "w#local1of2", "float32", 3, num_workers=4, writers=frozenset({1, 3}))
    with pytest.raises(RoundError, match=r"rank 0 pushed round 1, but only rank\(s\) \[1, 3\] push this key"):
        ks.push(1, 0, np.ones(3, np.float32))
    assert ks.push(1, 1, np.ones(3, np.float32)) is None
    slot = ks.push(1, 3, np.full(3, 2, np.float32))
    np.testing.assert_array_equal(slot.out, np.full(3, 3, np.float32))
    ks.push(2, 1, np.ones(3, np.float32))
    with pytest.raises(RoundError, match=r"not been pulled by rank\(s\) \[1, 3\]"):
        ks.push(3, 1, np.ones(3, np.float32))
    ks.pull(1, 1)
    slot.pulled.update({1, 3})  # both writers were answered: the slot can take round 3
    assert ks.push(3, 1, np.ones(3, np.float32)) is None
