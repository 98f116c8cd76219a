"""``pushpull profile``: measure a per-layer compute profile of a model.

A *layer* is a module that directly owns parameters (normally a leaf: Conv2d,
Linear, BatchNorm, LayerNorm, Embedding). Layers are listed in the order in
which their forward runs.

Forward: a forward pre-hook stamps the clock each time a layer starts; the time
up to the next layer's start (or the end of the loss) belongs to that layer,
so parameter-free modules (ReLU, pooling, attention softmax) are charged to
the layer before them and the layer times add up to the whole forward pass.

Backward: a post-accumulate-grad hook stamps the clock when each parameter's
gradient is ready; a layer is ready when its last parameter is. Sorting layers
by ready time, a layer's backward time is the gap since the previous ready
layer (the first gap starts at ``loss.backward()``); the tail after the last
gradient goes to the last layer, so the sum is the measured backward time.
This is exactly what a communication scheduler sees: when each layer's
gradients become available.

The same machinery runs with a FLOP counter as the clock on the ``meta``
device (:func:`estimate_profile`), which gives a shape-derived profile of
models too large to run here, scaled to a reference GPU.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from typing import Callable

import torch
from torch import nn

from pushpull.cli import help_text
from pushpull.profiles import LayerProfile, Profile, TensorSpec

log = logging.getLogger(__name__)

# Reference GPU for shape-derived profiles (V100-SXM2, fp32): 15.7 TFLOP/s peak,
# 900 GB/s HBM2. Dense conv/GEMM training reaches ~60 % of peak (ResNet-50 at
# batch 32 runs ~370 img/s fp32 on a V100, i.e. ~9.3 TFLOP/s of its 24.5 GFLOP
# per image), memory-bound ops ~70 % of bandwidth; each kernel costs a few µs.
V100 = dict(name="synthetic-v100", flops=15.7e12 * 0.6, bw=900e9 * 0.7, launch_s=8e-6)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def layer_table(model: nn.Module) -> tuple[dict[str, list[tuple[str, nn.Parameter]]], dict[int, str]]:
    """Group parameters by the module that directly owns them.

    Returns ``{module_name: [(param_name, param), ...]}`` in registration order
    and ``{id(param): module_name}``. Tied parameters are counted once, with the
    first owner (the same rule as ``named_parameters``).
    """
    full_names = {id(p): n for n, p in model.named_parameters()}
    owners: dict[str, list[tuple[str, nn.Parameter]]] = {}
    owner_of: dict[int, str] = {}
    for mname, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            if id(p) in owner_of or not p.requires_grad:
                continue
            owner_of[id(p)] = mname
            owners.setdefault(mname, []).append((full_names[id(p)], p))
    return owners, owner_of


class _Recorder:
    """Installs the hooks and turns one step's clock stamps into per-layer costs."""

    def __init__(self, model: nn.Module, clock: Callable[[], float]):
        self.model = model
        self.clock = clock
        self.owners, self.owner_of = layer_table(model)
        self.fwd_events: list[tuple[float, str]] = []
        self.ready: dict[str, float] = {}
        self.first_order: list[str] = []
        self.handles = []
        for mname, mod in model.named_modules():
            if mname in self.owners:
                self.handles.append(mod.register_forward_pre_hook(self._pre_hook(mname)))
        for mname, plist in self.owners.items():
            for _, p in plist:
                self.handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(mname)))

    def _pre_hook(self, mname):
        def hook(_mod, _inp):
            self.fwd_events.append((self.clock(), mname))
        return hook

    def _grad_hook(self, mname):
        def hook(_p):
            self.ready[mname] = self.clock()  # the last parameter of a layer wins
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def step(self, loss_fn, batch) -> tuple[dict[str, float], dict[str, float], float, float]:
        """Run one forward+backward; return per-layer fwd and bwd costs and totals."""
        self.fwd_events.clear()
        self.ready.clear()
        self.model.zero_grad(set_to_none=True)
        t0 = self.clock()
        loss = loss_fn(self.model, batch)
        t1 = self.clock()
        loss.backward()
        t2 = self.clock()
        fwd = {m: 0.0 for m in self.owners}
        ev = self.fwd_events
        for i, (t, m) in enumerate(ev):
            end = ev[i + 1][0] if i + 1 < len(ev) else t1
            fwd[m] += end - t
        if ev:  # input preparation before the first layer
            fwd[ev[0][1]] += ev[0][0] - t0
        if not self.first_order:
            seen = dict.fromkeys(m for _, m in ev)
            self.first_order = list(seen) + [m for m in self.owners if m not in seen]
        bwd = {m: 0.0 for m in self.owners}
        prev = t1
        order = sorted(self.ready.items(), key=lambda kv: kv[1])
        for m, t in order:
            bwd[m] = t - prev
            prev = t
        if order:
            bwd[order[-1][0]] += t2 - prev
        return fwd, bwd, t1 - t0, t2 - t1


def _build_profile(name, rec: _Recorder, fwds, bwds, tf, tb, batch_size, device, source) -> Profile:
    """Median per layer over steps, rescaled so the sums equal the median totals."""
    med_tf, med_tb = statistics.median(tf), statistics.median(tb)
    lf = {m: statistics.median(s[m] for s in fwds) for m in rec.owners}
    lb = {m: statistics.median(s[m] for s in bwds) for m in rec.owners}
    sf, sb = sum(lf.values()), sum(lb.values())
    kf = med_tf / sf if sf > 0 else 1.0
    kb = med_tb / sb if sb > 0 else 1.0
    layers = []
    for m in rec.first_order:
        tensors = [TensorSpec(pn, p.numel(), _dtype_name(p.dtype)) for pn, p in rec.owners[m]]
        layers.append(LayerProfile(m or "<root>", lf[m] * kf, lb[m] * kb, tensors))
    return Profile(model=name, layers=layers, batch_size=batch_size, device=device, source=source)


def profile_model(model: nn.Module, batch, loss_fn, *, name: str = "model", batch_size: int = 1,
                  steps: int = 5, warmup: int = 2, device: str = "cpu") -> Profile:
    """Measure ``model`` for ``warmup + steps`` steps, keep the median of ``steps``."""
    dev = torch.device(device)
    if dev.type == "cuda":
        def clock():
            torch.cuda.synchronize(dev)
            return time.perf_counter()
        dev_name = f"cuda:{torch.cuda.get_device_name(dev)}"
    else:
        clock = time.perf_counter
        dev_name = "cpu"
    model.train()
    rec = _Recorder(model, clock)
    fwds, bwds, tf, tb = [], [], [], []
    try:
        for i in range(warmup + steps):
            f, b, a, c = rec.step(loss_fn, batch)
            log.debug("step %d: fwd %.4f s bwd %.4f s", i, a, c)
            if i >= warmup:
                fwds.append(f), bwds.append(b), tf.append(a), tb.append(c)
    finally:
        rec.remove()
        model.zero_grad(set_to_none=True)
    return _build_profile(name, rec, fwds, bwds, tf, tb, batch_size, dev_name, "measured")


class _CostClock:
    """A 'clock' that advances by the modelled cost of the ops dispatched so far.

    cost = FLOPs / flops_rate + bytes touched / bandwidth + launch overhead per
    op, counted by a TorchDispatchMode so it works on the ``meta`` device.
    """

    def __init__(self, gpu: dict):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        self.gpu = gpu
        self.t = 0.0
        clock = self
        self._registry = flop_registry

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                clock._account(func, args, kwargs, out)
                return out

        self.mode = Mode()

    def _account(self, func, args, kwargs, out):
        packet = getattr(func, "overloadpacket", func)
        nbytes = 0
        flat_in = torch.utils._pytree.tree_leaves((args, kwargs))
        flat_out = torch.utils._pytree.tree_leaves(out)
        for x in flat_in + flat_out:
            if isinstance(x, torch.Tensor):
                nbytes += x.numel() * x.element_size()
        if packet in (torch.ops.aten.view, torch.ops.aten._unsafe_view, torch.ops.aten.t,
                      torch.ops.aten.transpose, torch.ops.aten.permute, torch.ops.aten.expand,
                      torch.ops.aten.detach, torch.ops.aten.slice, torch.ops.aten.select,
                      torch.ops.aten.unsqueeze, torch.ops.aten.squeeze, torch.ops.aten.reshape,
                      torch.ops.aten.as_strided, torch.ops.aten.alias):
            return  # metadata only, no kernel
        flops = 0
        fn = self._registry.get(packet)
        if fn is not None:
            flops = fn(*args, **kwargs, out_val=out)
        g = self.gpu
        self.t += flops / g["flops"] + nbytes / g["bw"] + g["launch_s"]

    def __call__(self) -> float:
        return self.t


def estimate_profile(name: str, batch_size: int, gpu: dict = V100, **model_kw) -> Profile:
    """Shape-derived profile: run the model on ``meta`` tensors, cost every op.

    No memory and no compute is used, so it works for BERT-large on a laptop.
    Absolute times are an estimate for ``gpu`` (default a V100-class GPU);
    the split between layers and between forward and backward follows the
    real operator graph.
    """
    from pushpull.bench.models import build_model, example_batch

    with torch.device("meta"):
        model = build_model(name, **model_kw)
    batch, loss_fn = example_batch(name, batch_size)
    batch = {k: v.to("meta") for k, v in batch.items()}
    model.train()
    clk = _CostClock(gpu)
    rec = _Recorder(model, clk)
    try:
        with clk.mode:
            f, b, a, c = rec.step(loss_fn, batch)
    finally:
        rec.remove()
    prof = _build_profile(name, rec, [f], [b], [a], [c], batch_size, gpu["name"], "shapes")
    for layer in prof.layers:  # a layer runs at least one kernel each way: keep times positive
        layer.fwd_s = max(layer.fwd_s, gpu["launch_s"])
        layer.bwd_s = max(layer.bwd_s, gpu["launch_s"])
    return prof


def measure(name: str, batch_size: int, steps: int = 5, warmup: int = 2, device: str = "cpu",
            seq_len: int | None = None, **model_kw) -> Profile:
    """Build ``name`` with synthetic inputs and measure it on ``device``."""
    from pushpull.bench.models import build_model, example_batch

    torch.manual_seed(0)
    model = build_model(name, **model_kw).to(device)
    batch, loss_fn = example_batch(name, batch_size, seq_len=seq_len, device=device)
    return profile_model(model, batch, loss_fn, name=name, batch_size=batch_size,
                         steps=steps, warmup=warmup, device=device)


def main(argv: list[str] | None = None) -> int:
    from pushpull.bench.models import model_names

    ap = argparse.ArgumentParser(prog="pushpull profile", description=help_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--model", required=True, help=f"one of: {', '.join(model_names())}")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=None, help="sequence length (BERT/GPT-2)")
    ap.add_argument("--steps", type=int, default=5, help="measured steps (median is kept)")
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped before measuring")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--estimate", action="store_true",
                    help="no measurement: derive times from shapes for a V100-class GPU")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--out", required=True, help="profile JSON to write")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model not in model_names():
        ap.error(f"unknown model {args.model!r}; known: {', '.join(model_names())}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda but CUDA is not available")
    if args.estimate:
        prof = estimate_profile(args.model, args.batch_size)
    else:
        prof = measure(args.model, args.batch_size, args.steps, args.warmup, args.device, args.seq_len)
    prof.save(args.out)
    print(f"{args.model}: {len(prof.layers)} layers, {sum(len(l.tensors) for l in prof.layers)} tensors, "
          f"{prof.numel:,} params; fwd {prof.fwd_s * 1e3:.2f} ms, bwd {prof.bwd_s * 1e3:.2f} ms "
          f"(batch {prof.batch_size}, {prof.device}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
