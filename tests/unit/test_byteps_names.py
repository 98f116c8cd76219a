"""BytePS's names a BytePS user calls, in one process: ``DistributedOptimizer(compression_params=...)`` (the
spec dict BytePS's compression docs pass) is the same as ``compression=`` that dict, and both at once or not
a dict is refused saying which; ``byteps_push_pull`` (BytePS's own tests call it) is the in-place
asynchronous push_pull."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def bps():
    import pushpull.torch as bps

    bps.init()
    return bps


def _opt(bps, **kw):
    m = torch.nn.Linear(3, 2)
    return bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                    **kw)


def test_compression_params_is_the_compression_spec(bps):
    spec = {"compressor": "onebit", "ef": "vanilla", "scaling": True}
    assert _opt(bps, compression_params=spec)._compression.spec == _opt(bps, compression=spec)._compression.spec


def test_compression_and_compression_params_together_are_refused(bps):
    with pytest.raises(ValueError, match="not both"):
        _opt(bps, compression=bps.Compression.fp16, compression_params={"compressor": "onebit"})


def test_compression_params_that_is_not_a_dict_is_refused(bps):
    with pytest.raises(TypeError, match="compression_params must be a dict"):
        _opt(bps, compression_params="onebit")


def test_a_bad_compressor_in_compression_params_is_named(bps):
    with pytest.raises(ValueError, match="compressor"):
        _opt(bps, compression_params={"compressor": "twobit"})


def test_byteps_push_pull_is_the_in_place_asynchronous_push_pull(bps):
    """BytePS's own tests call ``bps.byteps_push_pull(tensor, name=...)`` and synchronize the handle."""
    t = torch.arange(4.0)
    bps.declare("byteps_name")
    out = bps.synchronize(bps.byteps_push_pull(t, name="byteps_name"))
    assert torch.equal(out, torch.arange(4.0)) and out.data_ptr() == t.data_ptr()
