"""``pushpull top``: a running job at a glance, in the terminal, from its Prometheus endpoints.

    pushpull top --port 9400 [--host 127.0.0.1] [--interval 1] [--once]

Reads every worker's and server's endpoint (PUSHPULL_METRICS_PORT = ``--port``: worker r at port + r,
server k at port + 500 + k; pushpull.metrics) every ``--interval`` seconds and shows per worker its steps per
second, last step time, megabytes pushed and pulled per second and partitions in flight, and per server its
keys, rounds per second, queue depth and late pushes. Why the endpoints and not the job's own sockets: they
need no job secret, and a user can point Prometheus at the same ports. ``--once`` prints one table (two
readings ``--interval`` apart) and exits.
"""
from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

from pushpull.metrics import SERVER_PORT_OFFSET

MAX_NODES = 256  # endpoints probed per role
GAP = 8  # consecutive absent endpoints that end the probe (a lost worker leaves a hole in the ranks)


def read(host: str, port: int, timeout: float = 2.0) -> dict[str, float] | None:
    """One endpoint's ``pushpull_*`` samples by name (label sets dropped: one node per endpoint); None when
    nothing answers there."""
    try:
        text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout).read().decode()
    except (urllib.error.URLError, OSError):
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("pushpull_"):
            name, value = line.split("{")[0].split(" ")[0], line.rsplit(" ", 1)[1]
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def scan(host: str, port: int) -> dict[tuple[str, int], dict]:
    """Every endpoint of the job that answers: (role, index) -> samples."""
    found = {}
    for role, base in (("worker", port), ("server", port + SERVER_PORT_OFFSET)):
        missing = 0
        for i in range(MAX_NODES):
            got = read(host, base + i)
            if got is None:
                missing += 1
                if missing >= GAP:
                    break
                continue
            missing = 0
            found[(role, i)] = got
    return found


def _rate(now: dict, before: dict | None, name: str, dt: float) -> float:
    if before is None or dt <= 0 or name not in now or name not in before:
        return 0.0
    return max(0.0, now[name] - before[name]) / dt


def table(now: dict, before: dict, dt: float) -> str:
    """The job's table: workers, then servers."""
    lines = [f"{'worker':<8}{'rank':>5}{'steps/s':>9}{'step ms':>9}{'push MB/s':>11}{'pull MB/s':>11}"
             f"{'in flight':>10}{'errors':>8}"]
    for (role, i), m in sorted(now.items()):
        if role != "worker":
            continue
        b = before.get((role, i))
        lines.append(f"{i:<8}{m.get('pushpull_rank', -1):>5.0f}{_rate(m, b, 'pushpull_steps_total', dt):>9.2f}"
                     f"{1e3 * m.get('pushpull_step_seconds', 0):>9.1f}"
                     f"{_rate(m, b, 'pushpull_bytes_pushed_total', dt) / 1e6:>11.2f}"
                     f"{_rate(m, b, 'pushpull_bytes_pulled_total', dt) / 1e6:>11.2f}"
                     f"{m.get('pushpull_ops_in_flight', 0):>10.0f}{m.get('pushpull_errors_total', 0):>8.0f}")
    lines.append("")
    lines.append(f"{'server':<8}{'keys':>6}{'rounds/s':>10}{'queue':>7}{'late pushes':>13}{'workers':>9}"
                 f"{'generation':>12}")
    for (role, i), m in sorted(now.items()):
        if role != "server":
            continue
        b = before.get((role, i))
        lines.append(f"{i:<8}{m.get('pushpull_server_keys', 0):>6.0f}{_rate(m, b, 'pushpull_server_rounds', dt):>10.1f}"
                     f"{m.get('pushpull_server_queue_depth', 0):>7.0f}"
                     f"{m.get('pushpull_server_late_pushes_total', 0):>13.0f}{m.get('pushpull_workers', 0):>9.0f}"
                     f"{m.get('pushpull_generation', 0):>12.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from pushpull.cli import help_text

    p = argparse.ArgumentParser(prog="pushpull top", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="the job's PUSHPULL_METRICS_PORT")
    p.add_argument("--host", default="127.0.0.1", help="where the endpoints listen (PUSHPULL_METRICS_HOST)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between readings")
    p.add_argument("--once", action="store_true", help="print one table and exit")
    a = p.parse_args(argv)
    before, t_before = scan(a.host, a.port), time.monotonic()
    if not before:
        print(f"pushpull top: no endpoint answers at {a.host}:{a.port} (workers) or :{a.port + SERVER_PORT_OFFSET} "
              f"(servers): is the job running with PUSHPULL_METRICS_PORT={a.port}?", file=sys.stderr)
        return 2
    try:
        while True:
            time.sleep(a.interval)
            now, t_now = scan(a.host, a.port), time.monotonic()
            text = table(now, before, t_now - t_before)
            if a.once:
                print(text)
                return 0
            sys.stdout.write("\033[H\033[J" + f"pushpull top: {len(now)} endpoint(s) at {a.host}:{a.port}, "
                             f"every {a.interval:g}s (Ctrl-C ends)\n\n" + text + "\n")
            sys.stdout.flush()
            if not now:
                print("\nthe job is gone")
                return 0
            before, t_before = now, t_now
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
