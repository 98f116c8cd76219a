"""``pushpull bench <name> [ARGS...]``: run ``pushpull.bench.<name>:main(argv)``.

Each benchmark is one module with its own argparse parser, imported only
when asked for, so a missing optional dependency of one benchmark does not
break the others.
"""
from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "allreduce": "push_pull against torch.distributed all-reduce on ResNet-50's gradients",
    "latency": "one-float push_pull against gloo all_reduce: median and p99 per call",
    "probe": "per-call cost of a tiny reduction on this machine, for the simulator (--message-s, --latency)",
    "compression": "compressors: ratio, speed and accuracy",
    "scheduling": "every communication strategy on one model: step time and speedup over wfbp",
    "wire": "CPU-seconds per GB per process: raw TCP, gloo, push_pull per auth mode, over loopback and veth",
    "grid": "a grid of benchmark runs",
    "report": "collect benchmark results into a report",
}


def _usage() -> str:
    lines = ["usage: pushpull bench NAME [ARGS...]", "", "benchmarks:"]
    lines += [f"  {n:<12} {h}" for n, h in BENCHMARKS.items()]
    lines += ["", "Run 'pushpull bench NAME --help' for the options of one benchmark."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name = argv[0]
    if name not in BENCHMARKS:
        print(f"pushpull bench: unknown benchmark {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        mod = importlib.import_module(f"pushpull.bench.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"pushpull.bench.{name}":
            print(f"pushpull bench: benchmark {name!r} is not available in this version "
                  f"(no module pushpull.bench.{name})", file=sys.stderr)
            return 2
        raise
    if not hasattr(mod, "main"):
        print(f"pushpull bench: pushpull.bench.{name} has no main(argv)", file=sys.stderr)
        return 2
    return int(mod.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
