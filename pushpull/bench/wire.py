"""``pushpull bench wire``: where each byte's CPU goes. CPU-seconds per GB moved, per process, for a raw
TCP stream, gloo's all_reduce and pushpull's push_pull, over loopback TCP and over a veth pair between
emulated hosts, for every ``PUSHPULL_AUTH`` mode and any extra environment variant, beside the per-byte
CPU cost of the primitives (memcpy, a float32 sum, AES-128-GCM, ChaCha20-Poly1305) measured in the same run.

Why: on a machine whose cores are busy (2 here, or a server's share of a real one) what a reduction costs
is CPU per byte, not time: time hides it while a core is idle, and the wall clock of a shared machine is
noise. The goal this reads off is pushpull <= 1.2x gloo per rank and <= 2x a raw TCP stream, workers and
servers alike, so every row prints both ratios.

What is measured, each in real processes over real sockets:

* ``raw``: two processes, one TCP connection, both directions at once (full duplex, as a worker pushes and
  pulls): each ``sendall``s a preallocated buffer in 4 MiB chunks from one thread and ``recv_into``s a
  preallocated buffer on another. The machine's bound per byte.
* ``gloo``: ``torch.distributed.all_reduce`` (gloo, SUM) of the same tensors between 2 ranks.
* ``push_pull``: pushpull's parameter server, n workers and k servers on the same tensors (SUM, in place),
  ``PUSHPULL_LOCAL_SHM=0 PUSHPULL_LOCAL_IPC=0`` so loopback means TCP. Servers are placed on hosts of their
  own, so on veth every byte crosses a veth pair.

CPU: user + system seconds of the whole process (every thread, libzmq's I/O threads included), from the
kernel's per-process accounting around the timed window: ``getrusage(RUSAGE_SELF)`` inside each worker,
gloo rank and raw process; for a server (run by the launcher, not by this benchmark) its
``/proc/PID/stat`` utime + stime, the same counters, read by worker 0 at the window's edges.

Units (GB = 1e9 bytes):

* ``CPU/GBp``: per GB of payload: the gradient bytes the job reduces (M per step), the same for every
  process of a job (a gloo rank, a worker, a server: what one step costs it, per byte of gradient), for
  a raw process the bytes it sends (it receives as many, as a worker sends and receives M);
* ``CPU/GBs``: per GB that crossed the process's socket, sent + received: 2M per step for a worker,
  2·2(n-1)/n·M for a gloo rank (ring), 2·n·M/k for a server, twice the bytes sent for a raw process;
* ``x gloo``: CPU/GBp / the mean gloo rank's (same transport) -- the per-rank goal;
  ``x gloo/s``: the same per socket byte; ``x raw``: CPU/GBs / the mean raw process's.
* ``GB/s``: payload bytes / the window's wall time.

Cells: ``--auth`` modes x (the baseline + every ``--variant LABEL:VAR=VAL,...``), each a pushpull job with
those variables (``--env VAR=VAL`` goes to every pushpull job), so a new transport setting is compared
without a code change. ``--json PATH`` appends every row as a JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from pushpull import units
from pushpull.cli import help_text

GB = 1e9
MiB = 1 << 20
AUTH_MODES = ("none", "plain", "curve", "auto")
# what makes loopback mean TCP for push_pull (else Unix sockets and shared memory carry the bytes)
BASE_PP_ENV = {"PUSHPULL_LOCAL_SHM": "0", "PUSHPULL_LOCAL_IPC": "0"}
# torch's intra-op pool on 2 cores spins: one thread in every torch process, gloo and pushpull alike
BASE_ENV = {"OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------- pure parts --

def cpu_per_gb(cpu_s: float, nbytes: float) -> float:
    """CPU-seconds per GB (1e9 bytes) of ``nbytes``."""
    if nbytes <= 0:
        raise ValueError(f"no bytes moved ({nbytes})")
    return cpu_s / (nbytes / GB)


def ratio(x: float | None, base: float | None) -> float | None:
    return None if x is None or not base else x / base


def parse_env_pair(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` -> (NAME, VALUE); the value may be empty, the name may not."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not name or not name.replace("_", "").isalnum() or name[0].isdigit():
        raise ValueError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``LABEL:VAR=VAL,VAR=VAL`` (or ``LABEL:`` for none) -> (LABEL, {VAR: VAL})."""
    label, colon, rest = text.partition(":")
    label = label.strip()
    if not colon or not label:
        raise ValueError(f"expected LABEL:VAR=VAL[,VAR=VAL...], got {text!r}")
    env = dict(parse_env_pair(p) for p in rest.split(",") if p.strip())
    return label, env


def parse_auth(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in AUTH_MODES]
    if bad or not modes:
        raise ValueError(f"--auth: expected some of {','.join(AUTH_MODES)}, got {text!r}")
    return list(dict.fromkeys(modes))


@dataclass
class Cell:
    """One pushpull job's settings: the auth mode, the variant's label and the variables it runs with."""
    auth: str
    variant: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.auth + (f"+{self.variant}" if self.variant else "")


def make_cells(auth: list[str], variants: list[tuple[str, dict[str, str]]], env: dict[str, str],
               baseline: bool = True) -> list[Cell]:
    """auth modes x (baseline + variants); variables: base < PUSHPULL_AUTH < --env < the variant's. A variant
    that sets PUSHPULL_AUTH itself is labelled by it, and a cell that repeats another's variables is dropped."""
    cells, seen = [], set()
    for a in auth:
        for label, venv in ([("", {})] if baseline else []) + list(variants):
            e = dict(BASE_PP_ENV)
            e["PUSHPULL_AUTH"] = a
            e.update(env)
            e.update(venv)
            key = tuple(sorted(e.items()))
            if key in seen:
                continue
            seen.add(key)
            cells.append(Cell(e["PUSHPULL_AUTH"], label, e))
    return cells


def payload_bytes(method: str, role: str, per_step: int, steps: int, workers: int = 2,
                  servers: int = 1) -> tuple[float, float]:
    """(payload, socket) bytes of one process over the window (module docstring, Units). ``per_step``: M,
    the gradient bytes the job reduces per step (for raw: the bytes each process sends). A server's payload
    is M too, whatever its share of the keys: with k = n servers each moves 2M per step, as a ring rank does,
    and compares 1:1 with it; one server for n workers moves 2nM and shows it."""
    m = per_step * steps
    if method == "raw":
        return m, 2 * m
    if method == "gloo":
        return m, 2 * 2 * (workers - 1) / workers * m
    if method == "push_pull":
        if role.startswith("server"):
            return m, 2 * workers * m / servers
        return m, 2 * m
    raise ValueError(f"unknown method {method!r}")


def make_row(method: str, transport: str, auth: str, role: str, cpu_s: float, wall_s: float, payload: float,
             sock: float | None, **extra) -> dict:
    row = {"method": method, "transport": transport, "auth": auth, "role": role, "cpu_s": cpu_s,
           "wall_s": wall_s, "payload_bytes": payload, "socket_bytes": sock,
           "cpu_per_gb_payload": cpu_per_gb(cpu_s, payload),
           "cpu_per_gb_socket": cpu_per_gb(cpu_s, sock) if sock else None,
           "rate_GBps": payload / wall_s / GB if wall_s > 0 else None}
    row.update(extra)
    return row


def add_ratios(rows: list[dict]) -> list[dict]:
    """Per transport: every row's ``x_gloo`` (CPU/GBp over the mean gloo rank's), ``x_gloo_socket`` and
    ``x_raw`` (CPU/GBs over the mean raw process's). Primitives (transport '-') get none."""
    def mean(method, t, key):
        v = [r[key] for r in rows if r["method"] == method and r["transport"] == t and r.get(key)]
        return statistics.mean(v) if v else None

    for r in rows:
        t = r["transport"]
        if t == "-":
            r.update(x_gloo=None, x_gloo_socket=None, x_raw=None)
            continue
        r["x_gloo"] = ratio(r["cpu_per_gb_payload"], mean("gloo", t, "cpu_per_gb_payload"))
        r["x_gloo_socket"] = ratio(r["cpu_per_gb_socket"], mean("gloo", t, "cpu_per_gb_socket"))
        r["x_raw"] = ratio(r["cpu_per_gb_socket"], mean("raw", t, "cpu_per_gb_socket"))
    return rows


COLUMNS = [("method", "method", "{}"), ("transport", "transport", "{}"), ("auth", "auth/variant", "{}"),
           ("role", "role", "{}"), ("wall_s", "wall s", "{:.2f}"), ("rate_GBps", "GB/s", "{:.3f}"),
           ("cpu_s", "CPU s", "{:.2f}"), ("cpu_per_gb_payload", "CPU/GBp", "{:.3f}"),
           ("cpu_per_gb_socket", "CPU/GBs", "{:.3f}"), ("x_gloo", "x gloo", "{:.2f}"),
           ("x_gloo_socket", "x gloo/s", "{:.2f}"), ("x_raw", "x raw", "{:.2f}")]


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table (a markdown table's cells, so it pastes into a results page)."""
    cells = [[h for _, h, _ in COLUMNS]]
    for r in rows:
        cells.append(["-" if r.get(k) is None else f.format(r[k]) for k, _, f in COLUMNS])
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = []
    for j, c in enumerate(cells):
        lines.append("| " + " | ".join(v.ljust(w) if i < 4 else v.rjust(w)
                                       for i, (v, w) in enumerate(zip(c, widths))) + " |")
        if j == 0:
            lines.append("|" + "|".join("-" * (w + 2) if i < 4 else "-" * (w + 1) + ":"
                                        for i, w in enumerate(widths)) + "|")
    return "\n".join(lines)


def _worst(rows: list[dict], key: str) -> str:
    v = [r[key] for r in rows if r.get(key) is not None]
    return f"{max(v):.2f}" if v else "-"


def goal_lines(rows: list[dict], gloo_goal: float = 1.2, raw_goal: float = 2.0) -> list[str]:
    """One line per push_pull cell: its worst worker and worst server against the goal."""
    out = []
    cells = dict.fromkeys((r["transport"], r["auth"]) for r in rows if r["method"] == "push_pull")
    for t, a in cells:
        parts = []
        for kind in ("worker", "server"):
            rs = [r for r in rows if r["method"] == "push_pull" and r["transport"] == t and r["auth"] == a
                  and r["role"].startswith(kind)]
            if rs:
                parts.append(f"{kind}s x gloo {_worst(rs, 'x_gloo')} (per socket byte {_worst(rs, 'x_gloo_socket')})"
                             f", x raw {_worst(rs, 'x_raw')}")
        ok = all(r.get("x_gloo") is not None and r["x_gloo"] <= gloo_goal and r.get("x_raw") is not None
                 and r["x_raw"] <= raw_goal for r in rows
                 if r["method"] == "push_pull" and r["transport"] == t and r["auth"] == a)
        out.append(f"  {t:<8} {a:<16} {'; '.join(parts)}  -> {'meets' if ok else 'misses'} the goal "
                   f"(<= {gloo_goal:g}x gloo, <= {raw_goal:g}x raw)")
    return out


def expected_rows(cells: int, workers: int, servers: int) -> int:
    """Rows of one transport: 2 raw processes, a gloo rank per worker, every cell's workers and servers."""
    return 2 + workers + cells * (workers + servers)


def steps_for(gb: float, per_step: int) -> int:
    """Timed steps so that each rank reduces at least ``gb`` GB (at least 2)."""
    return max(2, -(-int(gb * GB) // per_step))


# ---------------------------------------------------------------- CPU accounting --

def self_cpu() -> float:
    """User + system seconds of this process, every thread included."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def parse_proc_stat(text: str, hz: float) -> float:
    """utime + stime (seconds) from a /proc/PID/stat line (the command name may hold spaces and ')')."""
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / hz  # fields 14 and 15 of the line, counting from 1


def pid_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        return parse_proc_stat(f.read(), os.sysconf("SC_CLK_TCK"))


# ---------------------------------------------------------------- primitives --

def primitives(gb: float, buf_bytes: int = 64 * MiB, chunk: int = 4 * MiB) -> list[dict]:
    """Per-byte CPU of memcpy, a float32 sum and two AEADs, on this (driver) process's one thread, over
    ``gb`` GB of distinct memory (a ``buf_bytes`` buffer passed over repeatedly)."""
    import numpy as np

    src = np.random.default_rng(0).random(buf_bytes // 4, dtype=np.float32).view(np.uint8)  # finite floats
    dst = np.ones(buf_bytes + 16 * (buf_bytes // chunk), dtype=np.uint8)  # touched: no page faults timed
    passes = max(1, -(-int(gb * GB) // buf_bytes))
    rows = []

    def measure(name, body, nbytes):
        body()  # warm: pages touched, code loaded
        c0, t0 = self_cpu(), time.perf_counter()
        for _ in range(passes):
            body()
        wall, cpu = time.perf_counter() - t0, self_cpu() - c0
        rows.append(make_row(name, "-", "-", "1 thread", cpu, wall, nbytes * passes, None))

    d = dst[:buf_bytes]
    measure("memcpy", lambda: np.copyto(d, src), buf_bytes)
    a, b = src.view(np.float32), d.view(np.float32)
    measure("sum f32", lambda: np.add(b, a, out=b), buf_bytes)
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
    except ImportError:  # pragma: no cover - cryptography is a dependency of the security layer
        return rows
    nonce = bytes(12)
    n = buf_bytes // chunk
    sv, dv = memoryview(src), memoryview(dst)
    for name, cls, key in (("aes128gcm", AESGCM, bytes(16)), ("chacha20poly1305", ChaCha20Poly1305, bytes(32))):
        aead = cls(key)
        if not hasattr(aead, "encrypt_into"):
            continue
        sealed = [aead.encrypt(nonce, bytes(sv[i * chunk:(i + 1) * chunk]), None) for i in range(n)]

        def enc(aead=aead):
            for i in range(n):
                aead.encrypt_into(nonce, sv[i * chunk:(i + 1) * chunk], None, dv[i * (chunk + 16):(i + 1) * (chunk + 16)])

        def dec(aead=aead, sealed=sealed):
            for i in range(n):
                aead.decrypt_into(nonce, sealed[i], None, dv[i * chunk:(i + 1) * chunk])

        measure(f"{name} enc", enc, buf_bytes)
        measure(f"{name} dec", dec, buf_bytes)
        del sealed
    return rows


# ---------------------------------------------------------------- children --

def raw_child(spec: dict) -> int:
    """One end of the raw TCP stream: both directions at once on one connection; prints one JSON line."""
    import threading

    import numpy as np

    total, chunk, buf = spec["bytes"], spec["chunk"], spec["buf"]
    src = np.random.default_rng(spec["listen"]).integers(0, 256, buf, dtype=np.uint8)
    dst = np.ones(buf, dtype=np.uint8)  # touched now, so that no first-touch page fault lands in the window
    if spec["listen"]:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((spec["host"], spec["port"]))
        ls.listen(1)
        ls.settimeout(60)
        conn, _ = ls.accept()
        ls.close()
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection((spec["host"], spec["port"]), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    conn.settimeout(None)  # blocking: with a timeout Python polls before every send and receive
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sendall(b"g")  # both ends start together
    if conn.recv(1) != b"g":
        raise RuntimeError("raw stream: the peer did not start")
    from pushpull.bench.grid_child import link_counters

    iface = spec.get("iface")
    l0 = link_counters(iface)
    c0, t0 = self_cpu(), time.perf_counter()
    sv, dv = memoryview(src), memoryview(dst)
    err = []

    def send():
        try:
            sent = off = 0
            while sent < total:
                k = min(chunk, total - sent, buf - off)
                conn.sendall(sv[off:off + k])
                sent += k
                off = (off + k) % buf
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            err.append(e)

    th = threading.Thread(target=send, daemon=True)
    th.start()
    got = off = 0
    while got < total:
        k = conn.recv_into(dv[off:off + min(chunk, total - got, buf - off)])
        if k == 0:
            raise RuntimeError(f"raw stream: the peer closed after {got} of {total} bytes")
        got += k
        off = (off + k) % buf
    th.join()
    wall, cpu = time.perf_counter() - t0, self_cpu() - c0
    l1 = link_counters(iface)
    if err:
        raise err[0]
    conn.close()
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "sent": total, "received": got,
                      "link": [l1[0] - l0[0], l1[1] - l0[1]] if l0 and l1 else None}), flush=True)
    return 0


def gloo_child(spec: dict) -> int:
    """One gloo rank (torchrun-style variables from the emulated cluster's launcher)."""
    import datetime

    import torch
    import torch.distributed as dist

    from pushpull.bench.grid_child import link_counters

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=120))
    tensors = [torch.zeros(spec["numel"]) for _ in range(spec["tensors"])]

    def step():
        for w in [dist.all_reduce(t, async_op=True) for t in tensors]:
            w.wait()

    for _ in range(spec["warmup"]):
        step()
    iface = os.environ.get("GLOO_SOCKET_IFNAME")
    iface = iface if iface and iface != "lo" else None  # loopback's counters are every process's
    dist.barrier()
    l0 = link_counters(iface)
    c0, t0 = self_cpu(), time.perf_counter()
    for _ in range(spec["steps"]):
        step()
    wall, cpu = time.perf_counter() - t0, self_cpu() - c0
    l1 = link_counters(iface)
    dist.barrier()
    _write(f"{spec['out']}.rank{rank}", {"cpu_s": cpu, "wall_s": wall,
                                         "link": [l1[0] - l0[0], l1[1] - l0[1]] if l0 and l1 else None})
    dist.destroy_process_group()
    return 0


def pp_child(spec: dict) -> int:
    """One pushpull worker; worker 0 also reads the servers' CPU (their pids from the driver's file)."""
    import torch

    import pushpull.torch as bps
    from pushpull.bench.grid_child import link_counters

    torch.set_num_threads(1)
    bps.init()
    rank = bps.rank()
    tensors = [torch.zeros(spec["numel"]) for _ in range(spec["tensors"])]

    def step():
        hs = [bps.push_pull_async_inplace(t, average=False, name=f"wire.{i}") for i, t in enumerate(tensors)]
        for h in hs:
            bps.synchronize(h)

    for _ in range(spec["warmup"]):
        step()
    pids: list[int] = []
    if rank == 0:
        deadline = time.monotonic() + 60
        while not os.path.exists(spec["pids"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no server pids in {spec['pids']} after 60 s")
            time.sleep(0.05)
        with open(spec["pids"]) as f:
            pids = json.load(f)["servers"]
    iface = os.environ.get("DMLC_INTERFACE")
    iface = iface if iface and iface != "lo" else None
    bps.barrier()
    s0 = [pid_cpu(p) for p in pids]
    sl0 = [link_counters(iface, p) for p in pids]
    ts0 = time.perf_counter()
    l0 = link_counters(iface)
    c0, t0 = self_cpu(), time.perf_counter()
    for _ in range(spec["steps"]):
        step()
    wall, cpu = time.perf_counter() - t0, self_cpu() - c0
    l1 = link_counters(iface)
    bps.barrier()  # every worker's last pull answered: the servers' work is done
    s1 = [pid_cpu(p) for p in pids]
    sl1 = [link_counters(iface, p) for p in pids]
    ts = time.perf_counter() - ts0

    def delta(a, b):
        return [b[0] - a[0], b[1] - a[1]] if a and b else None

    res = {"cpu_s": cpu, "wall_s": wall, "link": delta(l0, l1)}
    if rank == 0:
        res["servers"] = [{"cpu_s": b - a, "wall_s": ts, "link": delta(x, y)}
                          for a, b, x, y in zip(s0, s1, sl0, sl1)]
    _write(f"{spec['out']}.rank{rank}", res)
    bps.shutdown()
    return 0


def _write(path: str, obj: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- driver --

def _child_argv(kind: str, spec: dict) -> list[str]:
    return [sys.executable, "-m", "pushpull.bench.wire", "--child", kind, json.dumps(spec)]


def _port(cluster) -> int:
    if cluster.emulated:
        return 9300  # each emulated host has its own port space
    from pushpull.emulate.jobs import _free_port

    return _free_port()


def run_raw(cluster, transport: str, args, tmp: str) -> list[dict]:
    per = int(steps_for(args.gb, 4 * MiB) * 4 * MiB)
    port = _port(cluster)
    iface = cluster.iface if cluster.emulated else None
    base = {"bytes": per, "chunk": 4 * MiB, "buf": args.tensors * args.tensor_mib * MiB, "port": port,
            "host": cluster.addr(1), "iface": iface}
    import subprocess

    env = dict(os.environ, **BASE_ENV)
    ps = [cluster.popen(1, _child_argv("raw", dict(base, listen=1)), env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True),
          cluster.popen(0, _child_argv("raw", dict(base, listen=0)), env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)]
    rows = []
    for label, p in zip(("proc1 (listen)", "proc0 (connect)"), ps):
        out, err = p.communicate(timeout=args.timeout)
        if p.returncode != 0:
            raise RuntimeError(f"raw stream {label} failed (rc={p.returncode}):\n{err[-3000:]}")
        r = json.loads(out.strip().splitlines()[-1])
        pay, sock = payload_bytes("raw", label, per, 1)
        rows.append(make_row("raw", transport, "-", label, r["cpu_s"], r["wall_s"], pay, sock, link=r["link"]))
    return rows[::-1]


def run_gloo(cluster, transport: str, args, tmp: str) -> list[dict]:
    from pushpull.emulate.jobs import launch_torch_job

    per = args.tensors * args.tensor_mib * MiB
    steps = steps_for(args.gb, per)
    out = os.path.join(tmp, f"gloo-{transport}")
    spec = {"tensors": args.tensors, "numel": args.tensor_mib * MiB // 4, "warmup": args.warmup, "steps": steps,
            "out": out}
    job = launch_torch_job(cluster, args.workers, _child_argv("gloo", spec), env=dict(BASE_ENV),
                           log_dir=os.path.join(tmp, f"log-gloo-{transport}"))
    job.wait(args.timeout)
    rows = []
    for rank in range(args.workers):
        with open(f"{out}.rank{rank}") as f:
            r = json.load(f)
        pay, sock = payload_bytes("gloo", f"rank{rank}", per, steps, workers=args.workers)
        rows.append(make_row("gloo", transport, "-", f"rank{rank}", r["cpu_s"], r["wall_s"], pay, sock,
                             link=r["link"], steps=steps))
    return rows


def run_pp(cluster, transport: str, cell: Cell, args, tmp: str, index: int) -> list[dict]:
    from pushpull.emulate.jobs import launch_job

    per = args.tensors * args.tensor_mib * MiB
    steps = steps_for(args.gb, per)
    out = os.path.join(tmp, f"pp-{transport}-{index}")
    pids = out + ".pids"
    spec = {"tensors": args.tensors, "numel": args.tensor_mib * MiB // 4, "warmup": args.warmup, "steps": steps,
            "out": out, "pids": pids}
    env = dict(BASE_ENV, **cell.env)
    job = launch_job(cluster, args.workers, args.servers, _child_argv("pp", spec), env=env, placement="separate",
                     log_dir=os.path.join(tmp, f"log-pp-{transport}-{index}"))
    _write(pids, {"servers": [job[f"server{j}"].popen.pid for j in range(args.servers)]})
    job.wait(args.timeout)
    rows, servers = [], []
    extra = {"env": {k: v for k, v in cell.env.items()}, "variant": cell.variant, "steps": steps}
    for rank in range(args.workers):
        with open(f"{out}.rank{rank}") as f:
            r = json.load(f)
        servers = r.get("servers", servers)
        pay, sock = payload_bytes("push_pull", "worker", per, steps, args.workers, args.servers)
        rows.append(make_row("push_pull", transport, cell.label, f"worker{rank}", r["cpu_s"], r["wall_s"], pay,
                             sock, link=r["link"], **extra))
    for j, s in enumerate(servers):
        pay, sock = payload_bytes("push_pull", "server", per, steps, args.workers, args.servers)
        rows.append(make_row("push_pull", transport, cell.label, f"server{j}", s["cpu_s"], s["wall_s"], pay, sock,
                             link=s["link"], **extra))
    return rows


def run_transport(transport: str, cells: list[Cell], args, tmp: str, say) -> list[dict]:
    from pushpull.emulate import EmulatedCluster

    hosts = max(2, args.workers + args.servers)
    with EmulatedCluster(hosts, rate=args.rate if transport == "veth" else None,
                         force_loopback=transport == "loopback") as cluster:
        if transport == "veth" and not cluster.emulated:
            say("veth: network namespaces are not available here (see the warning above); skipped")
            return []
        rows = []
        say(f"{transport}: raw TCP stream")
        rows += run_raw(cluster, transport, args, tmp)
        say(f"{transport}: gloo all_reduce")
        rows += run_gloo(cluster, transport, args, tmp)
        for i, cell in enumerate(cells):
            say(f"{transport}: push_pull {cell.label}")
            try:
                rows += run_pp(cluster, transport, cell, args, tmp, i)
            except Exception as ex:  # noqa: BLE001 - one failed cell must not cost the others
                say(f"{transport}: push_pull {cell.label} failed: {str(ex)[-2000:]}")
        return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        kind, spec = argv[1], json.loads(argv[2])
        return {"raw": raw_child, "gloo": gloo_child, "pp": pp_child}[kind](spec)
    p = build_parser()
    args = p.parse_args(argv)
    try:
        cells = make_cells(parse_auth(args.auth), [parse_variant(v) for v in args.variant],
                           dict(parse_env_pair(e) for e in args.env), baseline=not args.no_baseline)
        transports = [t.strip() for t in args.transports.split(",") if t.strip()]
        if not transports or any(t not in ("loopback", "veth") for t in transports):
            raise ValueError(f"--transports: expected loopback and/or veth, got {args.transports!r}")
        if args.rate:
            units.rate_bits(args.rate, "--rate")
    except ValueError as ex:
        p.error(str(ex))
    if args.workers < 2:
        p.error("--workers must be >= 2")

    def say(text):
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    t_start = time.monotonic()
    say(f"primitives over {args.prim_gb:g} GB each")
    rows = primitives(args.prim_gb)
    with tempfile.TemporaryDirectory(prefix="pushpull-wire-") as tmp:
        for t in transports:
            rows += run_transport(t, cells, args, tmp, say)
    add_ratios(rows)
    stamp = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": socket.gethostname(), "cpus": os.cpu_count(),
             "loadavg": list(os.getloadavg()), "workers": args.workers, "servers": args.servers,
             "tensors": args.tensors, "tensor_bytes": args.tensor_mib * MiB, "rate": args.rate,
             "argv": argv}
    per = args.tensors * args.tensor_mib * MiB
    print(f"pushpull bench wire: {args.workers} workers, {args.servers} server(s), {args.tensors} tensors of "
          f"{args.tensor_mib} MiB (M = {per / GB:.3f} GB per step), >= {args.gb:g} GB per measurement; "
          f"veth rate {args.rate or 'unshaped'}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"ran {time.monotonic() - t_start:.0f} s")
    print("CPU = user + sys of the whole process over the timed window; GB = 1e9 bytes. CPU/GBp: per GB of "
          "gradient reduced (M per step, every process of the job alike; raw: bytes sent each way); CPU/GBs: per GB "
          "sent + received on its sockets. x gloo = CPU/GBp / mean gloo rank's, x raw = CPU/GBs / mean raw "
          "process's, same transport. Primitives: one thread, per GB of buffer processed.")
    print(format_table(rows))
    link = [sum(r["link"]) / r["socket_bytes"] for r in rows if r.get("link") and r.get("socket_bytes")]
    if link:
        print(f"check: veth interface counters (rx + tx) / the socket bytes assumed above: "
              f"{min(link):.3f} to {max(link):.3f} over {len(link)} processes (TCP/IP headers included)")
    lines = goal_lines(rows)
    if lines:
        print("goal (pushpull <= 1.2x gloo per rank, <= 2x raw TCP; worst role of each cell):")
        print("\n".join(lines))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, **stamp)) + "\n")
    expected = expected_rows(len(cells), args.workers, args.servers)
    missing = any(sum(1 for r in rows if r["transport"] == t) < expected for t in transports)
    return 1 if missing else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pushpull bench wire", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transports", default="loopback,veth", help="loopback and/or veth (default: both)")
    p.add_argument("--auth", default=",".join(AUTH_MODES),
                   help="PUSHPULL_AUTH modes, one pushpull job each (default: none,plain,curve,auto)")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:VAR=VAL[,VAR=VAL...]",
                   help="also run every auth mode with these variables, labelled auth+LABEL (repeatable), "
                        "e.g. --variant lane:PUSHPULL_DATA_LANE=1")
    p.add_argument("--no-baseline", action="store_true", help="run only the --variant cells")
    p.add_argument("--env", action="append", default=[], metavar="VAR=VAL",
                   help="a variable for every pushpull job (repeatable); PUSHPULL_LOCAL_SHM=0 and "
                        "PUSHPULL_LOCAL_IPC=0 are set unless this or a variant says otherwise")
    p.add_argument("--gb", type=float, default=1.0,
                   help="payload per measurement, GB (each rank's tensor bytes reduced; raw: bytes each way)")
    p.add_argument("--prim-gb", type=float, default=0.5, help="bytes per primitive, GB")
    p.add_argument("--tensors", type=int, default=16, help="tensors per step (default 16)")
    p.add_argument("--tensor-mib", type=int, default=4, help="MiB per tensor (default 4: M = 64 MiB)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--rate", default=None, help="shape the veth links, e.g. 10gbit (default: unshaped)")
    p.add_argument("--timeout", type=float, default=240, help="seconds per job")
    p.add_argument("--json", metavar="PATH", help="append the rows as JSON lines")
    return p


if __name__ == "__main__":
    sys.exit(main())
