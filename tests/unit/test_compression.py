"""Gradient compression: wire format, codec semantics, wrappers, registry, in this process (a payload
decoded by another process: tests/cluster/test_compression.py)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from pushpull.compression import (
    FP16,
    Dithering,
    ErrorFeedback,
    NesterovMomentum,
    NoCompression,
    OneBit,
    Payload,
    RandomK,
    RandomKSum,
    TopK,
    build,
    build_server,
    decode_payload,
    normalize_spec,
    resolve_k,
    spec_from_json,
    spec_to_json,
)
from pushpull.compression.base import CHUNK, HEADER

HEADER_MAX = HEADER.size + 8 * 4 + 16  # fixed header, up to 4-d shape, section alignment

CODECS = {
    "none": lambda: NoCompression(),
    "fp16": lambda: FP16(),
    "onebit": lambda: OneBit(scaling=True),
    "onebit-noscale": lambda: OneBit(scaling=False),
    "topk": lambda: TopK(0.5),
    "randomk": lambda: RandomK(0.5, seed=1),
    "randomk-unscaled": lambda: RandomK(0.5, seed=1, scale=False),
    "randomk-sum": lambda: RandomKSum(),
    "dithering": lambda: Dithering(2, seed=1),
    "dithering-natural-l2": lambda: Dithering(3, partition="natural", normalize="l2", seed=1),
    "dithering-8bit": lambda: Dithering(100, seed=1),
}
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SHAPES = [(), (0,), (1,), (7,), (31,), (33,), (3, 5, 7), (2, 0, 3)]


def wire(payload: Payload) -> Payload:
    """What the receiver sees: a copy of the bytes, rebuilt (read-only)."""
    return Payload.from_buffer(bytes(payload.to_buffer()))


@pytest.mark.parametrize("name", sorted(CODECS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_shape_dtype_and_wire(name, dtype):
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        x = torch.randn(shape, generator=gen).to(dtype)
        codec = CODECS[name]()
        payload = codec.compress(x)
        direct = codec.decompress(payload)
        assert direct.shape == x.shape and direct.dtype == dtype, (name, shape)
        buf = payload.to_buffer()
        assert isinstance(buf, memoryview) and buf.nbytes == payload.nbytes
        received = wire(payload)
        assert (received.codec, received.dtype, received.shape) == (payload.codec, dtype, tuple(shape))
        # Any compressor instance (or none) decodes any payload: the header says how.
        rebuilt = decode_payload(received)
        assert rebuilt.shape == x.shape and rebuilt.dtype == dtype
        assert torch.equal(rebuilt, direct), (name, shape)
        assert torch.equal(decode_payload(bytes(buf)), direct)


def test_lossless_codecs_are_exact():
    x = torch.randn(1001, dtype=torch.float64)
    assert torch.equal(decode_payload(wire(NoCompression().compress(x))), x)
    ints = torch.arange(10, dtype=torch.int64).reshape(2, 5)
    assert torch.equal(decode_payload(wire(NoCompression().compress(ints))), ints)
    y = torch.randn(1001)
    assert torch.equal(FP16().decompress(wire(FP16().compress(y))), y.half().float())
    assert FP16().compress(y).nbytes <= 2 * 1001 + HEADER_MAX


def test_decompress_into_out_and_other_dtype():
    x = torch.randn(4, 250)
    codec = OneBit()
    payload = codec.compress(x)
    out = torch.empty(4, 250)
    res = codec.decompress(payload, out=out)
    assert res is out and torch.equal(out, codec.decompress(payload))
    half = torch.empty(1000, dtype=torch.float16)
    codec.decompress(payload, out=half)
    assert torch.equal(half, codec.decompress(payload).reshape(-1).half())
    with pytest.raises(ValueError, match="elements"):
        codec.decompress(payload, out=torch.empty(999))


def test_from_buffer_rejects_garbage_and_truncation():
    buf = bytearray(OneBit().compress(torch.randn(100)).to_buffer())
    with pytest.raises(ValueError, match="truncated"):
        Payload.from_buffer(bytes(buf[:-4]))
    with pytest.raises(ValueError, match="too short"):
        Payload.from_buffer(b"PP")
    bad = bytearray(buf)
    bad[0:2] = b"XX"
    with pytest.raises(ValueError, match="magic"):
        Payload.from_buffer(bytes(bad))
    bad = bytearray(buf)
    bad[3] = 200  # codec id
    with pytest.raises(ValueError, match="codec"):
        Payload.from_buffer(bytes(bad))
    # Writable buffers (e.g. a numpy array from a socket) are accepted too.
    assert Payload.from_buffer(np.frombuffer(buf, dtype=np.uint8)).shape == (100,)


@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 1000, 2 * CHUNK + 13])
def test_onebit_signs_and_scale(n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen)
    x[0] = -abs(x[0]) - 0.1
    if n > 1:
        x[1] = 0.0  # sign bit clear: decodes to +scale
    payload = OneBit(scaling=True).compress(x)
    y = decode_payload(wire(payload))
    scale = x.double().abs().mean().item()
    assert payload.scale == pytest.approx(scale, rel=1e-6)
    assert torch.equal(torch.signbit(y), torch.signbit(x))
    assert torch.allclose(y.abs(), torch.full_like(y, scale), rtol=1e-6)
    y1 = decode_payload(OneBit(scaling=False).compress(x))
    assert torch.equal(y1, torch.where(x < 0, -1.0, 1.0))
    if n > 1:
        assert y[1] > 0 and y1[1] == 1.0
    # 32 signs per 4-byte word, plus the header.
    assert payload.nbytes == HEADER.size + 8 + 4 * math.ceil(n / 32)


def test_onebit_bit_layout_is_32_per_word_bit_set_negative():
    x = torch.ones(64)
    x[[0, 5, 33, 63]] = -2.0
    words = OneBit().compress(x).sections[0]
    assert words.dtype == torch.int32 and words.numel() == 2
    w = words.numpy().view(np.uint32)
    assert int(w[0]) == (1 << 0) | (1 << 5)
    assert int(w[1]) == (1 << 1) | (1 << 31)


def test_onebit_payload_is_about_n_over_8():
    n = 1 << 20
    payload = OneBit().compress(torch.randn(n))
    assert n // 8 <= payload.nbytes <= n // 8 + 64


def test_resolve_k():
    assert resolve_k(5, 100) == 5
    assert resolve_k(500, 100) == 100
    assert resolve_k(0.01, 1000) == 10
    assert resolve_k(1e-9, 1000) == 1
    assert resolve_k(0.5, 0) == 0


@pytest.mark.parametrize("n,k", [(100, 7), (1000, 0.01), (1 << 18, 0.01), (1 << 18, 0.001), (1 << 18, 3),
                                 (1 << 17, 0.3)])
def test_topk_keeps_exactly_the_k_largest(n, k):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen)
    payload = TopK(k).compress(x)
    kk = resolve_k(k, n)
    assert payload.count == kk
    idx = payload.sections[0].to(torch.int64)
    assert idx.unique().numel() == kk
    expected = torch.topk(x.abs(), kk).indices
    assert set(idx.tolist()) == set(expected.tolist())
    y = decode_payload(wire(payload))
    ref = torch.zeros(n)
    ref[expected] = x[expected]
    assert torch.equal(y, ref)
    assert payload.nbytes <= kk * (4 + 4) + HEADER_MAX


def test_topk_sample_miss_falls_back_exactly():
    n = 1 << 18
    x = torch.randn(n) * 1e-3
    # The strided threshold sample sees only big values: too few candidates,
    # so the exact fallback must kick in and still find the true top-k.
    x[::4] = torch.linspace(1.0, 2.0, n // 4)
    x[1] = 50.0
    payload = TopK(0.01).compress(x)
    kk = resolve_k(0.01, n)
    expected = set(torch.topk(x.abs(), kk).indices.tolist())
    assert set(payload.sections[0].tolist()) == expected


def test_topk_ties_give_exactly_k():
    x = torch.ones(1 << 17)
    x[10] = -3.0
    payload = TopK(100).compress(x)
    idx = payload.sections[0].tolist()
    assert len(idx) == 100 and len(set(idx)) == 100 and 10 in idx
    assert torch.count_nonzero(decode_payload(payload)) == 100


def test_topk_keeps_original_dtype_values():
    x = torch.randn(1000, dtype=torch.float64)
    payload = TopK(10).compress(x)
    assert payload.sections[1].dtype == torch.float64
    idx = payload.sections[0].to(torch.int64)
    assert torch.equal(payload.sections[1], x[idx])


def test_randomk_is_unbiased_and_scaled():
    n, k, trials = 200, 20, 3000
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, generator=gen, dtype=torch.float64).float()
    codec = RandomK(k, seed=7)
    acc = torch.zeros(n, dtype=torch.float64)
    out = torch.empty(n)
    for _ in range(trials):
        payload = codec.compress(x)
        idx = payload.sections[0].to(torch.int64)
        assert torch.allclose(payload.sections[1], x[idx] * (n / k))
        acc += codec.decompress(payload, out=out)
    mean = acc / trials
    # Per-element std of one decode: |x| * sqrt(n/k - 1) (draws with replacement).
    std = x.double().abs() * math.sqrt(n / k - 1) / math.sqrt(trials)
    z = (mean - x.double()) / std
    assert z.abs().max() < 5.0, z.abs().max()
    assert abs(z.mean()) < 5.0 / math.sqrt(n)
    assert torch.allclose(mean, x.double(), atol=0.35)  # the stated tolerance, in units of x


def test_randomk_seeded_reproducible_and_sizes():
    x = torch.randn(10000)
    a = bytes(RandomK(0.01, seed=3).compress(x).to_buffer())
    b = bytes(RandomK(0.01, seed=3).compress(x).to_buffer())
    c = bytes(RandomK(0.01, seed=4).compress(x).to_buffer())
    assert a == b and a != c
    assert len(a) <= 100 * 8 + HEADER_MAX


def test_randomk_unscaled_sends_each_drawn_entry_once():
    """scale=False (error feedback): decode is x on the drawn set and 0 elsewhere, even when
    draws repeat, so the residual x - decode never exceeds x (a contraction)."""
    n, k = 50, 40  # k close to n: many repeated draws
    x = torch.randn(n, dtype=torch.float64)
    codec = RandomK(k, seed=2, scale=False)
    for _ in range(20):
        payload = codec.compress(x)
        assert payload.flags == 0
        idx = payload.sections[0].to(torch.int64)
        assert idx.unique().numel() < k  # the test does exercise repeats
        assert torch.all(idx[1:] >= idx[:-1])
        dec = decode_payload(wire(payload))
        drawn = torch.zeros(n, dtype=torch.bool)
        drawn[idx] = True
        assert torch.equal(dec[drawn], x[drawn]) and torch.all(dec[~drawn] == 0)
        assert torch.all((x - dec).abs() <= x.abs())
    assert RandomK(k, seed=2).compress(x).flags == 1  # the scaled mode says so in the header


def test_randomk_scaling_follows_error_feedback_as_in_byteps():
    """BytePS scales random-k by n/k only without error feedback (randomk.cc, is_scale)."""
    assert build({"compressor": "randomk", "k": 0.1}).scale is True
    chain = build({"compressor": "randomk", "k": 0.1, "ef": "vanilla", "momentum": "nesterov"})
    assert isinstance(chain.inner, ErrorFeedback) and chain.inner.inner.scale is False
    # no seed given: every worker gets the same default seed, so all pick the same indices
    x = torch.randn(1000)
    a, b = (build({"compressor": "randomk", "k": 0.05}, seed_offset=3).compress(x) for _ in range(2))
    assert torch.equal(a.sections[0], b.sections[0])


@pytest.mark.parametrize("ef", ["none", "vanilla"])
def test_randomk_server_sends_the_shared_support_sum_exactly(ef):
    """The server neither re-samples nor re-scales a random-k sum (BytePS): with a shared seed
    the pull carries at most k pairs and decodes to exactly the sum of the decoded pushes."""
    spec = {"compressor": "randomk", "k": 0.05, "seed": 9, "ef": ef}
    n, workers = 4000, 3
    k = resolve_k(0.05, n)
    chains = [build(spec, seed_offset=1) for _ in range(workers)]
    server = build_server(spec, seed_offset=1)
    assert isinstance(server, RandomKSum)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        pushes = [c.compress(torch.randn(n, generator=gen)) for c in chains]
        assert all(torch.equal(p.sections[0], pushes[0].sections[0]) for p in pushes)
        total = sum(decode_payload(wire(p)) for p in pushes)
        pulled = server.compress(total)
        assert pulled.count <= k and pulled.nbytes <= pushes[0].nbytes
        assert torch.equal(decode_payload(wire(pulled)), total)
    # one worker: C(C(x)) == C(x), the check the launcher test makes through a real server
    one = decode_payload(build(spec).compress(torch.randn(n, generator=gen)))
    assert torch.equal(decode_payload(build_server(spec).compress(one)), one)
    # different seeds: still the exact sum, on the union of the supports
    xs = [decode_payload(RandomK(0.05, seed=s).compress(torch.randn(n, generator=gen))) for s in (1, 2)]
    pulled = RandomKSum().compress(xs[0] + xs[1])
    assert k < pulled.count <= 2 * k and torch.equal(decode_payload(pulled), xs[0] + xs[1])


def test_randomk_sum_keeps_dtype_and_nan():
    for dtype in DTYPES:
        x = torch.zeros(100, dtype=dtype)
        x[[3, 50, 99]] = torch.tensor([1.5, -2.0, float("nan")], dtype=dtype)
        out = decode_payload(wire(RandomKSum().compress(x.reshape(10, 10))))
        assert out.dtype == dtype and out.shape == (10, 10)
        assert torch.equal(out.view(-1)[:99], x[:99]) and torch.isnan(out.view(-1)[99])


def _levels(s: int, natural: bool) -> np.ndarray:
    if natural:
        return np.concatenate([[0.0], 2.0 ** (np.arange(1, s + 1) - s)])
    return np.arange(s + 1) / s


def _brackets(x: np.ndarray, scale: float, s: int, natural: bool):
    """The two levels (times scale) around each |x|."""
    lv = _levels(s, natural) * scale
    v = np.abs(x)
    hi_idx = np.clip(np.searchsorted(lv, v, side="left"), 1, s)
    return lv[hi_idx - 1], lv[hi_idx]


DITHER_CASES = [(s, p, nm) for s in (1, 2, 5, 16) for p in ("linear", "natural") for nm in ("max", "l2")]


@pytest.mark.parametrize("s,partition,normalize", DITHER_CASES)
def test_dithering_unbiased_and_within_levels(s, partition, normalize):
    natural = partition == "natural"
    # 24 distinct values (levels, midpoints, tiny ones, zero, both signs), each
    # repeated: the mean over repeats estimates E[decode] per value.
    base = np.array([1.0, -1.0, 0.75, -0.6, 0.5, 0.37, -0.25, 0.2, 0.126, -0.1, 0.05, 0.031,
                     -0.02, 0.011, 0.004, -0.003, 1e-4, 0.0, 0.9, -0.45, 0.3, 0.15, -0.07, 0.6],
                    dtype=np.float32)
    reps = 4000 if normalize == "max" else 400
    trials = 2 if normalize == "max" else 12
    x = torch.from_numpy(np.repeat(base, reps))
    codec = Dithering(s, partition=partition, normalize=normalize, seed=11)
    scale = float(np.abs(base).max()) if normalize == "max" else float(torch.linalg.vector_norm(x.double()))
    lo, hi = _brackets(base.astype(np.float64), scale, s, natural)
    allowed_lo = np.repeat(lo * np.sign(base), reps)
    allowed_hi = np.repeat(hi * np.sign(base), reps)
    total = np.zeros(base.size)
    for _ in range(trials):
        payload = wire(codec.compress(x))
        assert payload.scale == pytest.approx(scale, rel=1e-5)
        y = decode_payload(payload).double().numpy()
        # Every decoded value is one of the two levels around the input.
        near = np.isclose(y, allowed_lo, rtol=1e-5, atol=1e-12) | np.isclose(y, allowed_hi, rtol=1e-5, atol=1e-12)
        assert near.all(), (y[~near][:5], np.repeat(base, reps)[~near][:5])
        assert np.abs(y).max() <= scale * (1 + 1e-6)
        total += y.reshape(base.size, reps).sum(axis=1)
    mean = total / (reps * trials)
    a = np.abs(base.astype(np.float64))
    std = np.sqrt((hi - a) * (a - lo) / (reps * trials))
    err = np.abs(mean - base)
    assert (err <= 5 * std + 1e-6 * scale).all(), (base[err > 5 * std + 1e-6 * scale], err, std)


@pytest.mark.parametrize("s,bits", [(1, 2), (2, 4), (7, 4), (8, 8), (127, 8)])
def test_dithering_codes_are_compact_and_bounded(s, bits):
    n = 2 * CHUNK + 13  # several chunks plus a ragged tail
    x = torch.randn(n)
    for partition in ("linear", "natural"):
        payload = Dithering(s, partition=partition, seed=0).compress(x)
        assert payload.nbytes == HEADER.size + 8 + math.ceil(n * bits / 8)
        y = decode_payload(payload)
        q = (y / (payload.scale / s)).round() if partition == "linear" else None
        if q is not None:
            assert q.abs().max() <= s
            assert torch.allclose(y, q * (payload.scale / s), atol=1e-6 * payload.scale)
        assert y.abs().max() <= payload.scale * (1 + 1e-6)
        assert torch.equal(torch.signbit(y[y != 0]), torch.signbit(x[y != 0]))


def test_dithering_seeded_and_zero_input():
    x = torch.randn(5000)
    assert bytes(Dithering(4, seed=1).compress(x).to_buffer()) == bytes(Dithering(4, seed=1).compress(x).to_buffer())
    assert bytes(Dithering(4, seed=1).compress(x).to_buffer()) != bytes(Dithering(4, seed=2).compress(x).to_buffer())
    for partition in ("linear", "natural"):
        z = decode_payload(Dithering(3, partition=partition).compress(torch.zeros(77)))
        assert torch.equal(z, torch.zeros(77))
        bad = torch.randn(77)
        bad[3] = float("inf")  # a blown-up step must not arrive as a finite update
        assert decode_payload(Dithering(3, partition=partition, normalize="l2").compress(bad)).isnan().all()
    assert not torch.isfinite(decode_payload(OneBit().compress(bad))).any()


def test_dithering_rejects_bad_arguments():
    with pytest.raises(ValueError, match="partition"):
        Dithering(2, partition="log")
    with pytest.raises(ValueError, match="normalize"):
        Dithering(2, normalize="l1")
    with pytest.raises(ValueError, match="levels"):
        Dithering(0)
    with pytest.raises(ValueError, match="levels"):
        Dithering(128)


def _ef_run(codec, grads):
    decoded = torch.zeros_like(grads[0])
    err_norms = []
    for grad in grads:
        decoded += codec.decompress(wire(codec.compress(grad)))
        if isinstance(codec, ErrorFeedback):
            err_norms.append(codec.error.norm().item())
    return decoded, err_norms


@pytest.mark.parametrize("make", [lambda: TopK(0.1), lambda: OneBit(), lambda: RandomK(0.1, seed=3, scale=False)],
                         ids=["topk", "onebit", "randomk-unscaled"])
def test_error_feedback_bounds_error_and_tracks_gradient_sum(make):
    n, steps = 4096, 200
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(n, generator=gen) * 0.1 + 0.05  # a persistent direction plus noise
    grads = [g + 0.05 * torch.randn(n, generator=gen) for _ in range(steps)]
    total = torch.stack(grads).sum(0)
    grad_norm = max(x.norm().item() for x in grads)

    ef = ErrorFeedback(make())
    decoded, err_norms = _ef_run(ef, grads)
    # Invariant of vanilla EF at constant lr: sent + residual == sum of gradients.
    assert torch.allclose(decoded + ef.error, total, atol=2e-3)
    # So the sum of decoded updates tracks the sum of gradients up to the residual...
    rel_ef = ((decoded - total).norm() / total.norm()).item()
    plain, _ = _ef_run(make(), grads)
    rel_plain = ((plain - total).norm() / total.norm()).item()
    assert rel_ef < 0.1 and rel_plain > 4 * rel_ef, (rel_ef, rel_plain)
    # ...which stays bounded instead of growing with the step count.
    assert max(err_norms) < 20 * grad_norm
    if ef.inner.name in ("topk", "randomk"):  # delta-contractive with delta = k/n: settles within ~1/delta steps
        assert max(err_norms[steps // 2:]) < 1.25 * max(err_norms[: steps // 2])


def test_error_feedback_rescales_residual_by_lr_ratio():
    lrs = iter([1.0, 0.5, 0.5])
    current = {}

    def lr_getter():
        current["lr"] = next(lrs)
        return current["lr"]

    ef = ErrorFeedback(TopK(1), lr_getter=lr_getter)
    g1 = torch.tensor([3.0, 1.0, -2.0])
    ef.compress(g1)
    assert torch.equal(ef.error, torch.tensor([0.0, 1.0, -2.0]))
    g2 = torch.tensor([0.5, 0.0, 0.0])
    payload = ef.compress(g2)
    p = g2 + (1.0 / 0.5) * torch.tensor([0.0, 1.0, -2.0])  # [0.5, 2, -4]
    assert torch.equal(ef.decompress(payload), torch.tensor([0.0, 0.0, -4.0]))
    assert torch.equal(ef.error, p - torch.tensor([0.0, 0.0, -4.0]))


def test_nesterov_momentum_formula():
    mu = 0.9
    codec = NesterovMomentum(NoCompression(), mu=mu)
    g1, g2 = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.5])
    m1 = g1
    assert torch.allclose(codec.decompress(codec.compress(g1)), g1 + mu * m1)
    m2 = mu * m1 + g2
    assert torch.allclose(codec.decompress(codec.compress(g2)), g2 + mu * m2)
    assert torch.allclose(codec.momentum, m2)
    assert torch.equal(g1, torch.tensor([1.0, -2.0]))  # the caller's gradient is untouched
    with pytest.raises(ValueError, match="mu"):
        NesterovMomentum(NoCompression(), mu=1.5)


def test_build_chains_in_byteps_order():
    spec = {"compressor": "onebit", "scaling": True, "ef": "vanilla", "momentum": "nesterov", "mu": 0.8,
            "k": 0.01, "seed": 0, "partition": "linear", "normalize": "max"}
    worker = build(spec, lr_getter=lambda: 0.1)
    assert isinstance(worker, NesterovMomentum) and worker.mu == 0.8
    assert isinstance(worker.inner, ErrorFeedback) and isinstance(worker.inner.inner, OneBit)
    assert worker.inner.lr_getter() == 0.1
    server = build_server(spec)
    assert isinstance(server, ErrorFeedback) and isinstance(server.inner, OneBit)
    assert isinstance(build(None), NoCompression)
    assert isinstance(build("fp16"), FP16)
    d = build({"compressor": "dithering", "k": 4, "partition": "natural", "normalize": "l2", "seed": 2})
    assert (d.s, d.partition, d.normalize, d.seed) == (4, "natural", "l2", 2)
    assert build({"compressor": "randomk", "k": 10, "seed": 2}, seed_offset=5).seed == 7
    assert build("onebit").scaling is True and build({"compressor": "onebit", "scaling": False}).scaling is False


@pytest.mark.parametrize("spec,culprit,choices", [
    ({"compressor": "twobit"}, "twobit", "onebit"),
    ("zip", "zip", "dithering"),
    ({"compressor": "onebit", "ef": "fancy"}, "fancy", "vanilla"),
    ({"compressor": "onebit", "momentum": "adam"}, "adam", "nesterov"),
    ({"compressor": "onebit", "lr": 0.1}, "lr", "compressor"),
    ({"compressor": "dithering", "partition": "log"}, "log", "natural"),
    ({"compressor": "dithering", "normalize": "l1"}, "l1", "l2"),
    ({"compressor": "topk"}, "k", "fraction"),
    ({"compressor": "topk", "k": 0}, "k", "fraction"),
    ({"compressor": "randomk", "k": 2.5}, "k", "whole"),
    ({"compressor": "dithering", "k": 300}, "k", "127"),
    ({"compressor": "onebit", "scaling": "yes"}, "scaling", "true"),
    ({"compressor": "onebit", "mu": 1.0}, "mu", "[0, 1)"),
    ({"compressor": "randomk", "k": 5, "seed": -1}, "seed", "non-negative"),
])
def test_registry_errors_name_the_culprit(spec, culprit, choices):
    with pytest.raises(ValueError) as info:
        build(spec)
    assert culprit in str(info.value) and choices in str(info.value)


def test_spec_json_round_trip():
    spec = {"compressor": "topk", "k": 0.001, "ef": "vanilla"}
    text = spec_to_json(spec)
    assert json.loads(text)["compressor"] == "topk"
    back = spec_from_json(text)
    assert back == normalize_spec(spec) and back["k"] == 0.001 and back["ef"] == "vanilla"
    assert isinstance(build(back).inner, TopK)
    assert spec_from_json(spec_to_json(None))["compressor"] == "none"
    with pytest.raises(ValueError, match="JSON"):
        spec_from_json("{not json")


def test_compression_ratios_are_compact():
    n = 1 << 16
    x = torch.randn(n)
    assert build("onebit").compress(x).nbytes <= n / 8 + 64
    assert build({"compressor": "topk", "k": 0.01}).compress(x).nbytes <= resolve_k(0.01, n) * 8 + 64
    assert build({"compressor": "randomk", "k": 0.01}).compress(x).nbytes <= resolve_k(0.01, n) * 8 + 64
    assert build({"compressor": "dithering", "k": 2}).compress(x).nbytes <= n / 2 + 64
    assert build({"compressor": "dithering", "k": 1}).compress(x).nbytes <= n / 4 + 64
    assert build("fp16").compress(x).nbytes <= 2 * n + 64


def test_bench_main_json(capsys):
    from pushpull.bench.compression import main

    assert main(["--sizes", "64K", "--repeat", "1", "--compressors", "onebit,topk", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    rows = {r["compressor"]: r for r in result["results"]}
    assert set(rows) == {"onebit", "topk"}
    assert rows["onebit"]["ratio"] > 30 and rows["topk"]["ratio"] > 40
    assert all(r["gbps"] > 0 and r["fraction_of_copy"] > 0 for r in rows.values())


def test_onebit_takes_the_sign_as_byteps_does():
    """BytePS's onebit takes x < 0 as negative: -0.0 (and NaN) decode to +scale, float16 as float32
    (its test_onebit_3_scalingFalse_float16 counted 55 differing signs with the IEEE sign bit)."""
    for dtype in (torch.float32, torch.float16):
        x = torch.tensor([-0.0, 0.0, -1.5, 2.0, float("nan"), -1e-8], dtype=dtype)
        y = decode_payload(wire(OneBit(scaling=False).compress(x)))
        assert y.tolist() == [1.0, 1.0, -1.0, 1.0, 1.0, -1.0 if dtype == torch.float32 else 1.0], (dtype, y)
