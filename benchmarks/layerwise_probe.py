"""Measure what the optimizers cost the training thread, for the models of stored grid cells.

    python benchmarks/layerwise_probe.py docs/results/bytescheduler_speedup.jsonl docs/results/ddl_benchmarks.jsonl \
        docs/results/how_useful.jsonl [--procs 4] [--iters 20] [--out docs/results/layerwise_probe.jsonl]

For every (model, size scale, backend) of the namespaces-mode cells in the given grid results, runs
:func:`pushpull.bench.layerwise_probe.layerwise_probe` in ``--procs`` processes at once (default: the cells' worker
count, 4: the emulated cluster ran that many workers on this machine's cores) and appends one JSON line
per (model, backend) to ``--out`` with every process's result, the median over the processes of each
cost, the machine, its CPU count and its load average before and after. Communication is taken out (the
probe's reductions are free), so nothing here depends on the network or on the step times the
simulator is validated against; ``benchmarks/validate_sim.py`` reads the file with ``--opt-probe``.

Grid jobs run the same probe in every worker before their timed steps (``opt_probe`` in each row); this
script exists for the cells measured before that.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

FIELDS = ("update_lw_s", "step_lw_s", "step_s", "bwd_lw_s", "bwd_s", "wake_s", "base_fwd_s", "base_bwd_s")


def child(model: str, scale: float, backend: str, iters: int) -> int:
    import torch

    import pushpull.torch as bps
    from pushpull.bench.layerwise_probe import layerwise_probe

    torch.set_num_threads(1)   # as grid jobs run
    bps.init()                 # single process: the probe forces the distributed code paths itself
    print(json.dumps(layerwise_probe(model, scale, base="bytescheduler", backend=backend, iters=iters)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="*", help="grid results (JSON lines) whose models to probe")
    p.add_argument("--procs", type=int, default=None, help="processes at once (default: the cells' workers)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default="docs/results/layerwise_probe.jsonl")
    p.add_argument("--child", nargs=3, metavar=("MODEL", "SCALE", "BACKEND"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return child(a.child[0], float(a.child[1]), a.child[2], a.iters)
    combos: dict[tuple, int] = {}
    for f in a.results:
        for line in Path(f).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("mode") == "namespaces":
                combos[(r["model"], float(r["size_scale"]), r["backend"])] = int(r["workers"])
    if not combos:
        p.error("no namespaces-mode cells in the given results")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    for (model, scale, backend), workers in sorted(combos.items()):
        procs = a.procs or workers
        load0 = list(os.getloadavg())
        t0 = time.time()
        ps = [subprocess.Popen([sys.executable, __file__, "--child", model, repr(scale), backend,
                                "--iters", str(a.iters)], stdout=subprocess.PIPE, text=True, env=env)
              for _ in range(procs)]
        res = []
        for pr in ps:
            out, _ = pr.communicate(timeout=600)
            if pr.returncode != 0:
                raise SystemExit(f"probe of {model}/{backend} failed (exit {pr.returncode})")
            res.append(json.loads(out.strip().splitlines()[-1]))
        row = {"model": model, "size_scale": scale, "backend": backend, "procs": procs, "iters": a.iters,
               "tensors": res[0]["tensors"], "layers": res[0]["layers"],
               **{k: statistics.median(r[k] for r in res if r.get(k) is not None) for k in FIELDS},
               "per_process": res, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_s": time.time() - t0,
               "machine": socket.gethostname(), "cpus": os.cpu_count(), "loadavg_before": load0,
               "loadavg_after": list(os.getloadavg())}
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{model:<10} {backend:<9} {procs} procs: update_lw {row['update_lw_s'] * 1e6:.0f} us/tensor "
              f"({row['tensors']} tensors: {row['update_lw_s'] * row['tensors'] * 1e3:.1f} ms/iter), "
              f"step_lw {row['step_lw_s'] * 1e3:.2f} ms, step {row['step_s'] * 1e3:.2f} ms, "
              f"wake {row['wake_s'] * 1e6:.0f} us; load {load0[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
