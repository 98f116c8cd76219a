"""The server's compression chain follows the workers' learning rate, which
each compressed push carries in its header."""
import numpy as np
import torch

from pushpull.compression import build, decode_payload
from pushpull.server.codec import ServerCodec
from pushpull.transport.protocol import Header, MsgType, bits_f32, f32_bits


def test_lr_round_trips_through_the_header():
    for lr in (0.1, 1e-5, 0.035, 3.0):
        h = Header.unpack(Header(MsgType.PUSH, extra=f32_bits(lr)).pack())
        assert bits_f32(h.extra) == np.float32(lr)


def test_server_error_feedback_rescales_by_the_pushed_lr():
    spec = {"compressor": "topk", "k": 0.25, "ef": "vanilla"}
    sums = [torch.randn(64) for _ in range(3)]
    lrs = [0.1, 0.1, 0.025]  # a 4x decay before the third round
    server = ServerCodec(spec, "float32", 64, key=7)
    lr = {"v": lrs[0]}
    reference = build(spec, lr_getter=lambda: lr["v"], seed_offset=7)
    for total, rate in zip(sums, lrs):
        server.lr = rate
        lr["v"] = rate
        got = decode_payload(torch.from_numpy(server.compress_sum(total.numpy().copy())).numpy())
        want = decode_payload(reference.compress(total).buffer.numpy())
        assert torch.equal(got, want)
    # and the decay mattered: with the ratio fixed at 1 the third round differs
    flat = build(spec, seed_offset=7)
    outs = [decode_payload(flat.compress(t).buffer.numpy()) for t in sums]
    assert not torch.equal(outs[-1], got)
