"""The engine's two tensor kinds (pushpull/worker/tensors.py) and the average stage's NumPy division
(pushpull/worker/average.py), which replaced torch's: bit-identical to torch for every dtype."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pushpull import dtypes
from pushpull.worker.average import _divide
from pushpull.worker.tensors import NUMPY, kind_of


def _sample(d: dtypes.DType) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if d.floating:
        t = (torch.randn(4096, generator=g) * 100).to(d.torch)
        t[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]).to(d.torch)
        return t
    info = torch.iinfo(d.torch)
    t = torch.randint(info.min, info.max, (4096,), generator=g, dtype=d.torch)
    t[:2] = torch.tensor([info.min, info.max], dtype=d.torch)
    return t


@pytest.mark.parametrize("count", [2, 3, 7])
@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                                  "uint8"])
def test_numpy_division_matches_torch_bit_for_bit(name, count):
    d = dtypes.BY_NAME[name]
    t = _sample(d)
    want = t / count if d.floating else torch.div(t, count, rounding_mode="trunc")
    got = t.clone()
    _divide(got.reshape(-1).view(torch.uint8).numpy(), d, count)
    if d.floating:  # NaN payloads may differ; every other value bit for bit
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan)
        bits = getattr(torch, f"int{8 * d.itemsize}")
        assert torch.equal(got[~nan].view(bits), want[~nan].view(bits))
    else:
        assert torch.equal(got, want)


def test_kind_of_tells_numpy_from_torch():
    assert kind_of(np.zeros(2)) is NUMPY
    assert kind_of(torch.zeros(2)).name == "torch"


def test_kind_of_names_what_it_was_given():
    with pytest.raises(TypeError, match="push_pull of 'x'.*list"):
        kind_of([1.0], "push_pull of 'x'")


def test_numpy_kind_refuses_a_dtype_the_servers_cannot_sum():
    with pytest.raises(TypeError, match="bool is not supported"):
        NUMPY.dtype(np.zeros(2, dtype=bool))


def test_both_kinds_give_the_same_dtype_entry():
    for name in dtypes.TENSOR_NAMES:
        if dtypes.BY_NAME[name].np_native is None:
            continue
        assert NUMPY.dtype(np.zeros(1, dtype=name)) is kind_of(torch.zeros(1)).dtype(
            torch.zeros(1, dtype=getattr(torch, name)))


def test_numpy_kind_raw_bytes_are_a_writable_view():
    a = np.arange(4, dtype=np.float32)
    NUMPY.raw(a)[:4] = 0
    assert a[0] == 0.0 and a[1] == 1.0


@pytest.mark.parametrize("name,count", [("int8", 200), ("uint8", 300), ("int16", 40000), ("float16", 3000)])
def test_division_by_more_workers_than_the_dtype_holds_is_exact(name, count):
    """torch wraps such a divisor into the dtype (int8: 200 becomes -56); the result here is the sum divided
    by the count, toward zero (floats: rounded once from float32)."""
    d = dtypes.BY_NAME[name]
    t = _sample(d)[4:]  # no NaN or infinities: compared value for value
    if d.floating:
        want = (t.float() / count).to(t.dtype)
    else:
        wide = t.to(torch.int64)
        want = (wide.abs() // count * wide.sign()).to(t.dtype)
    got = t.clone()
    _divide(got.reshape(-1).view(torch.uint8).numpy(), d, count)
    assert torch.equal(got, want)


def test_numpy_kind_refuses_a_foreign_byte_order():
    with pytest.raises(TypeError, match="byte order"):
        NUMPY.dtype(np.arange(3, dtype=">f4"))


@pytest.mark.parametrize("name", ["float16", "float32", "int32"])
def test_scaled_rounds_as_torch_does(name):
    from pushpull.worker.tensors import scaled

    t = (torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 50).to(getattr(torch, name))
    want = (t * 0.1).to(t.dtype) if name != "int32" else (t * 0.1).to(torch.int32)
    got = scaled(t.numpy(), 0.1)
    assert got.dtype == t.numpy().dtype and np.array_equal(got, want.numpy())
