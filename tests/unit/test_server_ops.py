"""The server side of Horovod's collectives, without processes: min/max/product accumulation, concat keys,
round signatures that disagree (every rank of the round fails, naming who gave what), a rank aborting a
round, and the worker-side name spaces and kwargs checks."""
from __future__ import annotations

import numpy as np
import pytest

from pushpull.server.keystate import Disagreement, KeyState
from pushpull.server.reduce import Accumulator
from pushpull.transport.protocol import describe_sig, round_sig


@pytest.mark.parametrize("op,fn", [("min", np.minimum), ("max", np.maximum), ("product", np.multiply)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int32", "uint8"])
def test_accumulator_ops(op, fn, dtype):
    rng = np.random.default_rng(0)
    xs = [rng.integers(-3, 4, 7).astype(dtype) for _ in range(3)]
    acc = Accumulator(dtype, 7, op)
    acc.first(xs[0])
    for x in xs[1:]:
        acc.add(x)
    assert np.array_equal(acc.result(), fn(fn(xs[0], xs[1]), xs[2]).astype(dtype))


def test_half_precision_product_accumulates_in_float32():
    xs = [np.full(3, 1.001, np.float16) for _ in range(4)]
    acc = Accumulator("float16", 3, "product")
    acc.first(xs[0])
    for x in xs[1:]:
        acc.add(x)
    want = np.prod(np.stack(xs).astype(np.float32), 0).astype(np.float16)
    assert np.array_equal(acc.result(), want)


def _ks(op="sum", n=3, numel=4):
    ks = KeyState(7, "broadcast.w", "uint8" if op == "concat" else "float32", numel, n)
    ks.op = op
    return ks


def test_concat_writes_each_rank_at_its_offset():
    ks = _ks("concat", 3, 6)
    assert ks.push(1, 2, np.array([5, 6], np.uint8), offset=4) is None
    assert ks.push(1, 0, np.array([1], np.uint8), offset=0) is None
    slot = ks.push(1, 1, np.array([2, 3, 4], np.uint8), offset=1)
    assert slot is not None and list(slot.out) == [1, 2, 3, 4, 5, 6]


def test_disagreeing_signatures_fail_the_round_for_every_rank():
    ks = _ks()
    ks.push(1, 0, np.zeros(4, np.float32), sig=round_sig(root=0, dtype="float32"))
    ks.pull(1, 0).waiting.append(("w0", 0, 0))
    with pytest.raises(Disagreement) as e:
        ks.push(1, 1, np.zeros(4, np.float32), sig=round_sig(root=1, dtype="int32"))
    text = str(e.value)
    assert "'broadcast.w'" in text and "root_rank: rank(s) [0] gave 0, rank(s) [1] gave 1" in text
    assert "dtype: rank(s) [0] gave float32, rank(s) [1] gave int32" in text and "[2] had not pushed" in text
    assert e.value.slot.waiting == [("w0", 0, 0)]  # the server answers these with the error too
    with pytest.raises(Disagreement):  # the late rank gets it as well
        ks.push(1, 2, np.zeros(4, np.float32), sig=round_sig(root=0, dtype="float32"))


def test_an_aborted_round_fails_for_everyone_and_the_rest_is_untouched():
    ks = _ks(n=2)
    ks.push(1, 0, np.ones(4, np.float32))
    with pytest.raises(Disagreement, match="changed its shape"):
        ks.abort(1, 1, "rank 1 changed its shape")
    with pytest.raises(Disagreement, match="changed its shape"):
        ks.pull(1, 0)


def test_a_round_given_up_after_pushing_fails_for_everyone():
    """A rank whose deadline passed after its push aborts the round it is in: the others' pushes of that
    round fail (they must not sum the push it left behind)."""
    ks = _ks(n=2)
    ks.push(1, 0, np.ones(4, np.float32))
    with pytest.raises(Disagreement, match="did not finish"):
        ks.abort(1, 0, "rank 0: did not finish within 2s")
    with pytest.raises(Disagreement, match="did not finish"):
        ks.push(1, 1, np.full(4, 10.0, np.float32))


def test_a_round_given_up_after_it_completed_is_left_alone():
    ks = _ks(n=2)
    ks.push(1, 0, np.ones(4, np.float32))
    ks.push(1, 1, np.ones(4, np.float32))
    assert ks.abort(1, 0, "rank 0: did not finish within 2s") is None  # nothing to fail: the sum is right
    assert ks.pull(1, 1).error is None


def test_round_signature_fields():
    d = describe_sig(round_sig(root=3, dtype="bfloat16", average=True, scale=(2.0, 0.5)))
    assert d["root_rank"] == 3 and d["dtype"] == "bfloat16" and d["average"] is True
    assert d["prescale_factor/postscale_factor"] != "1.0/1.0"
    assert round_sig(average=False) != round_sig(average=True) != 0


def test_kwargs_errors_name_the_nearest_option():
    from pushpull.torch.kwargs import checked

    @checked
    def allreduce(tensor, average=None, name=None):
        return tensor

    with pytest.raises(TypeError, match="did you mean 'average'"):
        allreduce(1, averag=True)
    with pytest.raises(TypeError, match="TensorFlow option"):
        allreduce(1, device_dense="/gpu:0")
    with pytest.raises(TypeError, match="positional"):  # other TypeErrors pass through unchanged
        allreduce(1, 2, 3, 4)
