"""push_pull with compression through real servers (run under the launcher).

Checks BytePS's semantics: the worker compresses, the server decompresses the
pushes, sums, and compresses the sum again; so with one worker the result is
C(C(x)), computed here independently with fresh compressor chains."""
import sys

import torch

import pushpull.torch as bps
from pushpull.compression import build, build_server, decode_payload


def fail(msg):
    print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
    sys.exit(3)


bps.init()
r, n = bps.rank(), bps.size()
torch.manual_seed(0)
xs = [torch.randn(100_000) for _ in range(n)]   # every rank knows every rank's input
x = xs[r]

for spec in [{"compressor": "onebit", "scaling": True}, {"compressor": "fp16"},
             {"compressor": "topk", "k": 0.01}, {"compressor": "dithering", "k": 4, "seed": 3},
             {"compressor": "randomk", "k": 0.05, "seed": 1}]:
    name = f"c.{spec['compressor']}"
    got = bps.push_pull(x, average=False, name=name, compression=spec)
    key = bps.engine().table.entries["allreduce." + name].parts[0].key
    assert len(bps.engine().table.entries["allreduce." + name].parts) == 1
    # what the server must have computed: sum of decoded pushes, compressed again
    total = sum(decode_payload(build(spec, seed_offset=key).compress(xi)) for xi in xs)
    want = decode_payload(build_server(spec, seed_offset=key).compress(total))
    # the server sums in arrival order: cancellation leaves a residue of one ulp of the
    # summands, so the absolute tolerance is relative to the largest value
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max())):
        fail(f"{name}: got {got[:4].tolist()} want {want[:4].tolist()} "
             f"(max diff {(got - want).abs().max().item()})")
    print(f"{name} ok: pushed {bps.engine().stats['bytes_pushed']} bytes so far", flush=True)

# BYTEPS_THREADPOOL_SIZE > 0: the codec ran on the pool's threads, not the communication thread
import os, threading  # noqa: E401,E402
if int(os.environ.get("BYTEPS_THREADPOOL_SIZE", "0")) > 0:
    if bps.engine().pool is None or not any(t.name.startswith("pushpull-codec") for t in threading.enumerate()):
        fail("BYTEPS_THREADPOOL_SIZE is set but no codec thread ran")
    print("threadpool ok", flush=True)

# onebit with one worker: the result decodes to +-one scale
if n == 1:
    got = bps.push_pull(x, average=False, name="c.onebit2", compression={"compressor": "onebit"})
    if got.abs().unique().numel() != 1:
        fail("onebit with one worker should decode to +-one scale")

# small tensors are not compressed (BYTEPS_MIN_COMPRESS_BYTES)
small = torch.randn(10)
got = bps.push_pull(small, average=False, name="c.small", compression={"compressor": "onebit"})
if bps.engine().table.entries["allreduce.c.small"].compression is not None:
    fail("a 40-byte tensor was compressed despite min_compress_bytes")
if n == 1 and not torch.equal(got, small):
    fail("an uncompressed small tensor must come back exactly")

# ... but worker momentum still applies to them (it replaces the optimizer's): m = mu m + g; g' = g + mu m
spec = {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "mu": 0.5}
g = torch.full((10,), float(bps.rank() + 1))
for step in (1, 2):
    got = bps.push_pull(g, average=False, name="c.small.momentum", compression=spec)
    if bps.engine().table.entries["allreduce.c.small.momentum"].compression["compressor"] != "none":
        fail("a small tensor with worker momentum must travel uncompressed")
    m_sum = sum(float(r + 1) for r in range(n)) * (1.0 if step == 1 else 1.5)  # m1 = g, m2 = 0.5 g + g
    want = sum(float(r + 1) for r in range(n)) + 0.5 * m_sum
    if not torch.allclose(got, torch.full((10,), want)):
        fail(f"momentum on a small tensor, step {step}: got {got[0].item()}, want {want}")

# a bad spec fails at once, naming the tensor
try:
    bps.push_pull(x, name="c.bad", compression={"compressor": "zip"})
except ValueError as e:
    if "c.bad" not in str(e) or "zip" not in str(e):
        fail(f"bad spec error does not name tensor/compressor: {e}")
else:
    fail("bad compression spec accepted")
bps.shutdown()
print("ALL-OK", flush=True)
