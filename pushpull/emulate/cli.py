"""``pushpull cluster``: the emulated cluster from the command line.

    pushpull cluster check                         # can namespaces / tc / netem be used here?
    pushpull cluster measure --rate 200mbit --delay 1ms
    pushpull cluster cleanup                       # remove leftovers of earlier runs
    pushpull cluster launch --hosts 4 --workers 4 --servers 4 --rate 1gbit -- python train.py
    pushpull cluster torch --hosts 4 --rate 1gbit -- python ddp_train.py
"""
from __future__ import annotations

import argparse
import logging
import sys

from pushpull.cli import help_text
from pushpull.emulate import measure as _measure
from pushpull.emulate.jobs import JobError, launch_job, launch_torch_job
from pushpull.emulate.netns import (EmulatedCluster, cleanup, list_namespaces, netem_available,
                                    netns_unavailable_reason, parse_rate)

log = logging.getLogger(__name__)

# TCP payload per Ethernet frame on the wire as tbf counts it (1500-byte MTU,
# IPv4 + TCP with timestamps = 52 header bytes, 14 bytes Ethernet header)
GOODPUT_FRACTION = (1500 - 52) / (1500 + 14)


def _link_args(p: argparse.ArgumentParser, hosts_default: int | None = None) -> None:
    if hosts_default is not None:
        p.add_argument("--hosts", type=int, default=hosts_default, help="number of hosts")
    p.add_argument("--rate", default="1gbit", help="per-direction link rate, tc syntax ('none' = unshaped)")
    p.add_argument("--delay", default=None, help="one-way host-to-host delay, e.g. 1ms")
    p.add_argument("--loss", default=None, help="per-direction loss, e.g. 0.1%%")
    p.add_argument("--delay-backend", default="auto", choices=["auto", "netem", "nfqueue"])


def _cluster(args, hosts: int) -> EmulatedCluster:
    rate = None if str(args.rate).lower() in ("none", "0", "") else args.rate
    return EmulatedCluster(hosts, rate=rate, delay=args.delay, loss=args.loss, delay_backend=args.delay_backend)


def cmd_check(args) -> int:
    reason = netns_unavailable_reason()
    if reason:
        print(f"network namespaces: NOT available ({reason}); EmulatedCluster falls back to loopback")
        return 1
    print("network namespaces: available (ip netns, veth, bridge)")
    print(f"netem: {'available' if netem_available() else 'not in this kernel; delay/loss use the NFQUEUE delayer'}")
    left = list_namespaces()
    if left:
        print(f"namespaces with the ppx prefix present now: {', '.join(left)} (pushpull cluster cleanup)")
    return 0


def cmd_cleanup(args) -> int:
    removed = cleanup(include_live=args.force)
    print(f"removed {len(removed)} namespace(s){': ' + ', '.join(removed) if removed else ''}")
    left = list_namespaces()
    if left:
        print(f"kept (their creator is still running; --force removes them): {', '.join(left)}")
    return 0


def cmd_measure(args) -> int:
    with _cluster(args, 2) as c:
        if not c.emulated:
            print("warning: namespaces unavailable, measuring loopback without shaping", file=sys.stderr)
        r = _measure.throughput(c, 0, 1, seconds=args.seconds)
        t = _measure.rtt(c, 0, 1)
    got = r["bits_per_s"]
    print(f"configured: rate {args.rate}, delay {args.delay or '0'} one-way, loss {args.loss or '0'}"
          f"{' (delay/loss via ' + c.backend + ')' if c.backend else ''}")
    print(f"measured TCP goodput: {got / 1e6:.1f} Mbit/s over {r['seconds']:.2f} s ({r['bytes'] / 1e6:.1f} MB)")
    if c.rate_bps:
        wire = got / GOODPUT_FRACTION
        print(f"  = {got / c.rate_bps * 100:.1f} % of the configured rate "
              f"(on-wire incl. headers {wire / 1e6:.1f} Mbit/s = {wire / c.rate_bps * 100:.1f} %; "
              f"TCP/IP/Ethernet headers cap goodput at {GOODPUT_FRACTION * 100:.1f} %)")
    print(f"measured RTT: median {t['rtt_median_s'] * 1e3:.3f} ms, min {t['rtt_min_s'] * 1e3:.3f} ms "
          f"(configured {2 * c.delay_s * 1e3:.3f} ms)")
    return 0


def cmd_launch(args) -> int:
    if not args.command:
        print("pushpull cluster launch: give the worker command after --", file=sys.stderr)
        return 2
    hosts = args.hosts or (args.workers + args.servers if args.placement == "separate"
                           else max(args.workers, args.servers))
    with _cluster(args, hosts) as c:
        job = launch_job(c, args.workers, args.servers, args.command, placement=args.placement,
                         log_dir=args.log_dir)
        return _wait_and_report(job, args)


def _wait_and_report(job, args) -> int:
    """Wait for a job started on the cluster; 1 with the failure on stderr if it failed."""
    print(f"logs: {job.log_dir}")
    try:
        job.wait(args.timeout)
    except JobError as e:
        print(f"job failed: {e}", file=sys.stderr)
        return 1
    finally:
        if args.show_logs:
            for p in job.procs:
                print(f"----- {p.label} (host {p.host}) -----\n{p.tail(20000)}")
    return 0


def cmd_torch(args) -> int:
    if not args.command:
        print("pushpull cluster torch: give the command after --", file=sys.stderr)
        return 2
    world = args.world_size or args.hosts
    with _cluster(args, args.hosts) as c:
        job = launch_torch_job(c, world, args.command, procs_per_host=-(-world // args.hosts),
                               log_dir=args.log_dir)
        return _wait_and_report(job, args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="pushpull cluster", description=help_text(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="can network namespaces (and netem) be used here?")
    p = sub.add_parser("cleanup", help="remove namespaces left by earlier runs")
    p.add_argument("--force", action="store_true", help="also those whose creating process still runs")
    p = sub.add_parser("measure", help="2 hosts: configured vs measured TCP throughput and RTT")
    _link_args(p)
    p.add_argument("--seconds", type=float, default=3.0, help="length of the timed transfer")
    p = sub.add_parser("launch", help="run a pushpull job (scheduler, servers, workers) on emulated hosts")
    _link_args(p, hosts_default=0)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--placement", choices=["colocated", "separate"], default="colocated")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--show-logs", action="store_true")
    p = sub.add_parser("torch", help="run a torch.distributed (gloo) job, one rank per host")
    _link_args(p, hosts_default=2)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--show-logs", action="store_true")
    args = ap.parse_args(argv)
    args.command = command
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    if getattr(args, "rate", None) and str(args.rate).lower() not in ("none", "0", ""):
        try:
            parse_rate(args.rate)
        except ValueError as e:
            ap.error(str(e))
    handlers = {"check": cmd_check, "cleanup": cmd_cleanup, "measure": cmd_measure,
                "launch": cmd_launch, "torch": cmd_torch}
    try:
        return handlers[args.cmd](args)
    except KeyboardInterrupt:
        print("interrupted; cluster removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
