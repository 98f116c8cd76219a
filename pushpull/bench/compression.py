"""``pushpull bench compression``: codec throughput against a memory copy.

For each tensor size (fp32, standard normal) and each codec, times
compress + decompress and reports GB/s of fp32 input, the same rate as a
fraction of a plain ``dst.copy_(src)`` measured in the same run (the
ceiling: every codec must at least read the input and write the output),
and the compression ratio (input bytes / payload bytes, header included).

Decoding writes into a preallocated tensor, as a worker decodes into its
gradient buffer; compressing allocates a fresh payload each call, as the
transport may still hold the previous one. Times are the best of
``--repeat`` runs, which on a shared machine is the least noisy estimate.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from pushpull.cli import help_text
from pushpull.compression import build

# label -> registry spec; k=0.01 keeps 1 % of the elements for the sparse codecs.
DEFAULT_CODECS: dict[str, dict] = {
    "none": {"compressor": "none"},
    "fp16": {"compressor": "fp16"},
    "onebit": {"compressor": "onebit", "scaling": True},
    "topk": {"compressor": "topk", "k": 0.01},
    "randomk": {"compressor": "randomk", "k": 0.01, "seed": 0},
    "dithering": {"compressor": "dithering", "k": 2, "partition": "linear", "normalize": "max", "seed": 0},
    "dithering-l2": {"compressor": "dithering", "k": 2, "partition": "linear", "normalize": "l2", "seed": 0},
    "dithering-natural": {"compressor": "dithering", "k": 2, "partition": "natural", "normalize": "max", "seed": 0},
}
COPY_TRIES = 5


def parse_size(text: str) -> int:
    """'4M' -> 4 * 2**20 elements; plain integers are taken as is."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if mult != 1 else text
    try:
        value = int(float(digits) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 4M, 65536 or 64M") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(numel: int, codecs: dict[str, dict], repeat: int) -> tuple[float, list[dict]]:
    """Best-of-``repeat`` times, taken in interleaved rounds (copy, then every
    codec, then again) so that load from other processes hits all alike."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randn(numel, generator=gen)
    dst = torch.empty_like(src)
    nbytes = numel * src.element_size()
    built = {label: build(spec) for label, spec in codecs.items()}
    payloads = {label: codec.compress(src) for label, codec in built.items()}  # warm-up
    for label, codec in built.items():
        codec.decompress(payloads[label], out=dst)
    dst.copy_(src)
    best = {"copy": float("inf")}
    for label in built:
        best.update({(label, "compress"): float("inf"), (label, "decompress"): float("inf"),
                     (label, "both"): float("inf")})
    for _ in range(repeat):
        # The copy is cheap and, being multi-threaded, the most exposed to
        # other processes: give it a few tries per round for a fair ceiling.
        for _ in range(COPY_TRIES):
            best["copy"] = min(best["copy"], timed(lambda: dst.copy_(src)))
        for label, codec in built.items():
            payload = payloads[label]
            for what, fn in (("compress", lambda: codec.compress(src)),
                             ("decompress", lambda: codec.decompress(payload, out=dst)),
                             ("both", lambda: codec.decompress(codec.compress(src), out=dst))):
                best[label, what] = min(best[label, what], timed(fn))
    copy_gbps = nbytes / best["copy"] / 1e9
    rows = []
    for label, spec in codecs.items():
        gbps = nbytes / best[label, "both"] / 1e9
        rows.append({
            "size": numel,
            "compressor": label,
            "spec": spec,
            "gbps": gbps,
            "compress_gbps": nbytes / best[label, "compress"] / 1e9,
            "decompress_gbps": nbytes / best[label, "decompress"] / 1e9,
            "copy_gbps": copy_gbps,
            "fraction_of_copy": gbps / copy_gbps,
            "ratio": nbytes / payloads[label].nbytes,
            "payload_bytes": payloads[label].nbytes,
        })
    return copy_gbps, rows


def format_size(numel: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if numel % mult == 0:
            return f"{numel // mult}{unit}"
    return str(numel)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pushpull bench compression", description=help_text(__doc__.split("\n\n")[0]))
    p.add_argument("--sizes", default="4M,64M",
                   help="comma-separated fp32 element counts (K/M suffixes), default 4M,64M")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per measurement; the best is kept")
    p.add_argument("--compressors", default=",".join(DEFAULT_CODECS),
                   help=f"comma-separated subset of {','.join(DEFAULT_CODECS)}")
    p.add_argument("--json", action="store_true", help="last line: one JSON object with the results")
    args = p.parse_args(argv)

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    names = [c.strip() for c in args.compressors.split(",") if c.strip()]
    unknown = [n for n in names if n not in DEFAULT_CODECS]
    if unknown:
        p.error(f"unknown compressor(s) {unknown}; choose from {list(DEFAULT_CODECS)}")
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    codecs = {n: DEFAULT_CODECS[n] for n in names}

    header = f"{'size':>6} {'compressor':<18} {'GB/s':>7} {'of copy':>8} {'comp GB/s':>10} {'dec GB/s':>9} {'ratio':>7}"
    machine = platform.processor() or platform.machine()
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, {machine}; "
          f"best of {args.repeat}; GB/s of fp32 input for compress+decompress")
    all_rows, copies = [], {}
    for numel in sizes:
        copy_gbps, rows = measure(numel, codecs, args.repeat)
        copies[numel] = copy_gbps
        print(header)
        print(f"{format_size(numel):>6} {'copy (ceiling)':<18} {copy_gbps:7.2f} {1.0:8.2f} {'':>10} {'':>9} {'':>7}")
        for r in rows:
            print(f"{format_size(numel):>6} {r['compressor']:<18} {r['gbps']:7.2f} {r['fraction_of_copy']:8.3f} "
                  f"{r['compress_gbps']:10.2f} {r['decompress_gbps']:9.2f} {r['ratio']:7.1f}")
        all_rows.extend(rows)
    if args.json:
        print(json.dumps({
            "benchmark": "compression",
            "repeat": args.repeat,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "copy_gbps": {str(k): v for k, v in copies.items()},
            "results": all_rows,
        }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
