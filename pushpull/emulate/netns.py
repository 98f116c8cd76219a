"""A small cluster on one machine: hosts are network namespaces behind a switch.

Layout for a cluster with prefix ``P`` (e.g. ``ppx1a2bc`` = "ppx" + pid in hex +
a sequence letter)::

      P-h0            P-h1                      P-sw (the "switch")
    [eth0 10.213.s.1] [eth0 10.213.s.2] ...     [br0: vb0 vb1 ...]
          |                 |                        |   |
          +---- veth -------+------------------------+---+

Each host's ``eth0`` is one end of a veth pair whose other end (``vb<i>``) is a
port of a Linux bridge living in its own namespace ``P-sw``. Nothing is created
in the root namespace, so the host's firewall, routes and interface names are
never touched, and deleting the namespaces removes every link.

Shaping (full duplex, each direction of each link limited to ``rate``):

* rate: a ``tbf`` on both ends of every veth: ``eth0`` egress in the host
  (its uplink) and ``vb<i>`` egress in the switch (its downlink);
* delay/loss, backend ``netem`` (where the kernel has ``sch_netem``): on the
  host side ``netem`` is the root qdisc and ``tbf`` its child, so packets are
  delayed first, then paced;
* delay/loss, backend ``nfqueue`` (kernels without netem): in the switch an
  iptables rule drops packets at random (``statistic`` match) and queues the
  rest to :mod:`pushpull.emulate.delayer`, which releases them after ``delay``.

TCP: every host runs ``congestion`` (default ``cubic``, Linux's default) whatever
the machine running the emulation has configured: a namespace would otherwise
inherit it (this development VM's is ``bbr``, with which the k flows leaving a
parameter-server worker through one shallow token bucket lost thousands of
packets per step when every key was in flight at once). A kernel without it
keeps the inherited one, with a warning.

Either way one direction between two hosts crosses the delay/loss stage once
and two token buckets (sender uplink, receiver downlink): ``delay`` is the
one-way latency between hosts (RTT = 2 x delay) and ``loss`` the per-direction
loss probability.

Where namespaces cannot be made (not root, no iproute2, no kernel support) the
cluster degrades to loopback without shaping: every ``addr()`` is 127.0.0.1,
``popen`` runs the command directly and ``emulated`` is False.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from pushpull import units

log = logging.getLogger(__name__)

NAME_ROOT = "ppx"  # every namespace this module creates starts with it
SUBNET_BASE = (10, 213)  # 10.213.<seq>.0/24 per cluster; inside namespaces only
IFACE = "eth0"  # host-side interface name inside each host namespace
CMD_TIMEOUT = 20.0

_seq = itertools.count()


class EmulationError(RuntimeError):
    """A namespace / tc command failed; the message carries the command and stderr."""


# -- helpers ---------------------------------------------------------------

def _ip(*args: str, check: bool = True, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check, timeout=timeout)


def _run(argv: Sequence[str], check: bool = True, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    log.debug("+ %s", " ".join(argv))
    cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and cp.returncode != 0:
        raise EmulationError(f"{' '.join(argv)!r} failed (rc={cp.returncode}): {cp.stderr.strip()}")
    return cp


def parse_rate(rate) -> float:
    """A link rate ('200mbit', '1gbit', '10MB/s') -> bits per second; units as everywhere in pushpull
    (:mod:`pushpull.units`: 'mbps' is megabits, bytes only as 'MB/s'), whatever tc would make of them."""
    return units.rate_bits(rate, "rate")


def parse_time(t) -> float:
    """A delay ('1ms', '500us', '0.2s') -> seconds (:mod:`pushpull.units`: a bare number is refused)."""
    return units.duration_s(t, "delay")


def tbf_params(rate_bps: float, extra_queue_s: float = 0.0) -> tuple[int, int]:
    """Bucket size and queue limit (bytes) that let TCP reach ``rate_bps``.

    The bucket must hold at least a few full-size packets (and a GSO
    super-packet of 64 KiB, which tbf would otherwise have to split), and enough
    tokens for ~1 ms at the rate so timer granularity does not cost rate.
    The queue must absorb a window's worth of burst: 20 ms at the rate (plus
    the path's extra delay, i.e. a bandwidth-delay product), at least 200 KB.
    """
    byte_rate = rate_bps / 8
    burst = int(max(64 * 1024 + 1514, byte_rate * 1e-3))
    limit = int(max(200_000, byte_rate * (0.02 + 2 * extra_queue_s))) + burst
    return burst, limit


def parse_loss(loss: str | float) -> float:
    """'0.1%' or 0.001 -> probability in [0, 1)."""
    if isinstance(loss, (int, float)):
        p = float(loss)
    else:
        t = loss.strip()
        p = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    if not 0 <= p < 1:
        raise ValueError(f"loss must be a probability in [0, 1) or a percentage, got {loss!r}")
    return p


_netem_ok: bool | None = None


def netem_available() -> bool:
    """Whether this kernel has sch_netem (probed once in a throw-away namespace)."""
    global _netem_ok
    if _netem_ok is None:
        probe = f"{NAME_ROOT}{os.getpid():x}z-netem"
        try:
            _ip("netns", "add", probe)
            cp = _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                       "netem", "delay", "1ms"], check=False)
            _netem_ok = cp.returncode == 0
        except (EmulationError, OSError, subprocess.TimeoutExpired):
            _netem_ok = False
        finally:
            _ip("netns", "del", probe, check=False)
        log.info("sch_netem %s", "available" if _netem_ok else "not available: delay/loss via NFQUEUE")
    return _netem_ok


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


ALLOWED_CC = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"


def congestion_selectable(name: str) -> bool:
    """Whether a network namespace may select congestion control ``name`` (the root namespace's allowed
    list; a fresh machine often allows only its default and reno)."""
    try:
        return name in Path(ALLOWED_CC).read_text().split()
    except OSError:
        return True  # no such file: nothing restricts it


def list_namespaces() -> list[str]:
    """Namespaces that this module may have created (names starting with 'ppx')."""
    if shutil.which("ip") is None:
        return []
    cp = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in cp.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NAME_ROOT)]


def _kill_netns_pids(ns: str) -> None:
    """Kill every process still running inside ``ns`` (a leftover job)."""
    cp = _ip("netns", "pids", ns, check=False)
    for tok in cp.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def _owner_pid(ns: str) -> int | None:
    m = re.match(rf"{NAME_ROOT}([0-9a-f]+)[a-z]-", ns)
    return int(m.group(1), 16) if m else None


def cleanup(prefix: str = NAME_ROOT, include_live: bool = False) -> list[str]:
    """Remove leftover namespaces (and with them their veths and bridge).

    By default namespaces whose creating process is still alive are kept, so a
    cleanup never pulls the rug from under a cluster another run is using;
    ``include_live=True`` removes them too. Returns the names removed.
    """
    removed = []
    for ns in list_namespaces():
        if not ns.startswith(prefix):
            continue
        owner = _owner_pid(ns)
        if not include_live and owner is not None and owner != os.getpid() and pid_alive(owner):
            log.info("keeping %s: its creator (pid %d) is still running", ns, owner)
            continue
        _kill_netns_pids(ns)
        cp = _ip("netns", "del", ns, check=False)
        if cp.returncode == 0:
            removed.append(ns)
        else:
            log.warning("could not delete namespace %s: %s", ns, cp.stderr.strip())
    return removed


def netns_unavailable_reason() -> str | None:
    """None when namespaces can be created here, else why not (for messages and skips)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (euid != 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    probe = f"{NAME_ROOT}{os.getpid():x}z-probe"
    try:
        cp = _ip("netns", "add", probe, check=False)
        if cp.returncode != 0:
            return f"'ip netns add' failed: {cp.stderr.strip()}"
        cp = _ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if cp.returncode != 0:
            return f"cannot create a bridge inside a namespace: {cp.stderr.strip()}"
        cp = _ip("-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb", check=False)
        if cp.returncode != 0:
            return f"cannot create a veth pair: {cp.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"namespace probe failed: {e}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


# -- the cluster ---------------------------------------------------------------

class EmulatedCluster:
    """``hosts`` namespaces on a shaped switch; a context manager.

    rate: per-direction link rate in tc syntax ('1gbit', '200mbit'), None = unshaped.
    delay: one-way host-to-host latency ('1ms'), None = none.
    loss: per-direction packet loss ('0.1%'), None = none.
    force_loopback: skip namespaces and use the loopback fallback (for tests).
    delay_backend: 'auto' (netem if the kernel has it, else nfqueue), 'netem', 'nfqueue'.
    congestion: TCP congestion control of every host ('cubic'; None = inherit the machine's).
    """

    def __init__(self, hosts: int, rate: str | None = "1gbit", delay: str | None = None,
                 loss: str | None = None, prefix: str | None = None, force_loopback: bool = False,
                 delay_backend: str = "auto", congestion: str | None = "cubic"):
        if hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {hosts}")
        if hosts > 250:
            raise ValueError(f"at most 250 hosts per cluster (one /24), got {hosts}")
        self.hosts = hosts
        self.rate = rate
        self.rate_bps = parse_rate(rate) if rate else None
        self.delay = delay
        self.delay_s = parse_time(delay) if delay else 0.0
        self.loss = loss
        self.loss_p = parse_loss(loss) if loss else 0.0
        if delay_backend not in ("auto", "netem", "nfqueue"):
            raise ValueError(f"delay_backend must be auto, netem or nfqueue, got {delay_backend!r}")
        self.delay_backend = delay_backend
        # a new namespace inherits the creating machine's TCP congestion control (this VM's is bbr, a
        # cloud tuning); emulated hosts run Linux's default, cubic, unless told otherwise (None = inherit)
        self.congestion = congestion
        self._warned_congestion = False
        self.congestion_in_force: str | None = None  # read back from a host once the cluster is up
        self.backend: str | None = None  # the one in use, once started
        seq = next(_seq)
        self.prefix = prefix or f"{NAME_ROOT}{os.getpid():x}{chr(ord('a') + seq % 26)}-"
        self.subnet = f"{SUBNET_BASE[0]}.{SUBNET_BASE[1]}.{(os.getpid() + seq) % 250 + 1}"
        self.force_loopback = force_loopback
        self.emulated = False
        self._active = False
        self._created: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._old_handlers: dict[int, object] = {}
        self._lock = threading.Lock()

    # names
    def ns(self, i: int) -> str:
        self._check_host(i)
        return f"{self.prefix}h{i}"

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}sw"

    def addr(self, i: int) -> str:
        """IPv4 address of host ``i`` (127.0.0.1 in the loopback fallback)."""
        self._check_host(i)
        return f"{self.subnet}.{i + 1}" if self.emulated else "127.0.0.1"

    @property
    def iface(self) -> str:
        """Interface name that carries cluster traffic inside each host."""
        return IFACE if self.emulated else "lo"

    def _check_host(self, i: int) -> None:
        if not 0 <= i < self.hosts:
            raise IndexError(f"host {i} out of range (cluster has {self.hosts})")

    # lifecycle
    def __enter__(self) -> "EmulatedCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "EmulatedCluster":
        if self._active:
            return self
        self._install_signal_handlers()
        atexit.register(self.close)
        self._active = True
        reason = "force_loopback=True" if self.force_loopback else netns_unavailable_reason()
        if reason is not None:
            log.warning("emulated cluster unavailable (%s): falling back to loopback 127.0.0.1 "
                        "without rate/delay/loss shaping", reason)
            self.emulated = False
            return self
        try:
            self._build()
            self.emulated = True
        except BaseException:
            self.close()
            raise
        log.info("emulated cluster %s: %d hosts on %s.0/24, rate=%s delay=%s loss=%s%s",
                 self.prefix, self.hosts, self.subnet, self.rate, self.delay, self.loss,
                 f" (delay/loss via {self.backend})" if self.backend else "")
        return self

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _pick_backend(self) -> str | None:
        if not (self.delay_s or self.loss_p):
            return None
        if self.delay_backend in ("auto", "netem") and netem_available():
            return "netem"
        if self.delay_backend == "netem":
            raise EmulationError("delay_backend='netem' but this kernel has no sch_netem")
        if shutil.which("iptables") is None:
            raise EmulationError(
                "cannot emulate delay/loss: the kernel has no sch_netem and 'iptables' (for the "
                "NFQUEUE fallback) is not installed; install iptables or use a kernel with netem")
        return "nfqueue"

    def _build(self) -> None:
        self.backend = self._pick_backend()
        sw = self.switch_ns
        self._add_ns(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i in range(self.hosts):
            h = self.ns(i)
            self._add_ns(h)
            port = f"vb{i}"
            _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", IFACE, "netns", h)
            _ip("-n", sw, "link", "set", port, "master", "br0")
            _ip("-n", sw, "link", "set", port, "up")
            _ip("-n", h, "addr", "add", f"{self.addr_for(i)}/24", "dev", IFACE)
            _ip("-n", h, "link", "set", IFACE, "up")
            if self.congestion:
                self._set_congestion(h)
            self._shape(h, IFACE, host_side=True)
            self._shape(sw, port, host_side=False)
        cc = _run(["ip", "netns", "exec", self.ns(0), "cat", "/proc/sys/net/ipv4/tcp_congestion_control"])
        self.congestion_in_force = cc.stdout.strip() or None
        if self.backend == "nfqueue":
            self._start_nfqueue()

    def _set_congestion(self, ns: str) -> None:
        """Per-namespace TCP congestion control (net.ipv4.tcp_congestion_control is per netns). A namespace
        may only pick one the machine allows (net.ipv4.tcp_allowed_congestion_control, set in the root
        namespace only): otherwise the hosts keep the machine's, with a warning saying how to allow it,
        and ``congestion_in_force`` (what result rows record) says so."""
        avail = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
        if avail.exists() and self.congestion not in avail.read_text().split():
            log.warning("congestion control %r is not available in this kernel (available: %s); the emulated "
                        "hosts keep the machine's", self.congestion, avail.read_text().strip())
            return
        if not congestion_selectable(self.congestion):
            if not self._warned_congestion:
                self._warned_congestion = True
                allowed = Path(ALLOWED_CC).read_text().strip()
                log.warning("congestion control %r is not in net.ipv4.tcp_allowed_congestion_control (%s), so a "
                            "network namespace cannot select it; the emulated hosts keep the machine's. To "
                            "allow it: sysctl -w net.ipv4.tcp_allowed_congestion_control=\"%s %s\"",
                            self.congestion, allowed, allowed, self.congestion)
            return
        if not re.fullmatch(r"[a-z0-9_]+", self.congestion):
            raise EmulationError(f"not a congestion control name: {self.congestion!r}")
        # written from inside the namespace: net.ipv4.tcp_congestion_control is per network namespace
        _run(["ip", "netns", "exec", ns, "sh", "-c",
              f"echo {self.congestion} > /proc/sys/net/ipv4/tcp_congestion_control"])

    def _start_nfqueue(self) -> None:
        """Loss and delay in the switch: iptables FORWARD rules + the delayer process."""
        sw = self.switch_ns
        ipt = ["ip", "netns", "exec", sw, "iptables", "-w", "5"]
        # bridged IPv4 must traverse iptables (br_netfilter, per namespace)
        _run(["ip", "netns", "exec", sw, "sh", "-c", "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables"])
        if self.loss_p:
            _run(ipt + ["-A", "FORWARD", "-m", "statistic", "--mode", "random",
                        "--probability", f"{self.loss_p:.6f}", "-j", "DROP"])
        if self.delay_s:
            p = subprocess.Popen(["ip", "netns", "exec", sw, sys.executable, "-m", "pushpull.emulate.delayer",
                                  "--delay", repr(self.delay_s)],
                                 stdout=subprocess.PIPE, text=True, start_new_session=True)
            self._procs.append(p)
            ready, _, _ = select.select([p.stdout], [], [], 15.0)
            line = p.stdout.readline() if ready else ""
            if line.strip() != "ready":
                raise EmulationError(f"delay process did not start (rc={p.poll()}, said {line!r})")
            _run(ipt + ["-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "0"])

    def addr_for(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def _shape(self, ns: str, dev: str, host_side: bool) -> None:
        """Root qdisc(s) on ``dev``'s egress: [netem ->] tbf."""
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
        netem_args: list[str] = []
        if host_side and self.backend == "netem":
            if self.delay_s:
                netem_args += ["delay", f"{self.delay_s * 1e6:.0f}us"]
            if self.loss_p:
                netem_args += ["loss", f"{self.loss_p * 100:.6f}%"]
        tbf_args: list[str] = []
        if self.rate_bps:
            burst, limit = tbf_params(self.rate_bps, self.delay_s)
            tbf_args = ["tbf", "rate", f"{int(self.rate_bps)}bit", "burst", str(burst), "limit", str(limit)]
        if netem_args:
            # queue enough packets for the bandwidth-delay product (netem's default is 1000)
            pkts = 1000
            if self.rate_bps:
                pkts = max(1000, int(self.rate_bps / 8 * (self.delay_s + 0.05) / 1500) * 2)
            _run(tc + ["root", "handle", "1:", "netem", "limit", str(pkts)] + netem_args)
            if tbf_args:
                _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev,
                      "parent", "1:1", "handle", "10:"] + tbf_args)
        elif tbf_args:
            _run(tc + ["root", "handle", "1:"] + tbf_args)

    def close(self) -> None:
        """Stop processes started here, delete every namespace; idempotent."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        self._ignore_signals()  # a second Ctrl-C must not cut the cleanup short
        try:
            for p in self._procs:
                _terminate(p)
            self._procs.clear()
            for name in reversed(self._created):
                _kill_netns_pids(name)
                cp = _ip("netns", "del", name, check=False)
                if cp.returncode != 0 and name in list_namespaces():
                    log.warning("could not delete namespace %s: %s", name, cp.stderr.strip())
            self._created.clear()
        finally:
            self._restore_signal_handlers()
            try:
                atexit.unregister(self.close)
            except Exception:  # pragma: no cover
                pass

    # signals: turn SIGTERM into SystemExit so `with` blocks unwind and clean up
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; atexit still cleans up

        def on_term(signum, frame):
            raise SystemExit(128 + signum)

        def on_int(signum, frame):
            raise KeyboardInterrupt

        for sig, h in ((signal.SIGTERM, on_term), (signal.SIGINT, on_int)):
            try:
                self._old_handlers[sig] = signal.signal(sig, h)
            except (ValueError, OSError):  # pragma: no cover
                pass

    def _ignore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self._old_handlers:
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (ValueError, OSError):  # pragma: no cover
                pass

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, h in self._old_handlers.items():
            try:
                signal.signal(sig, h)
            except (ValueError, OSError, TypeError):  # pragma: no cover
                pass
        self._old_handlers.clear()

    # running things
    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` inside host ``i``."""
        if not self._active:
            raise RuntimeError("cluster is not started (use 'with EmulatedCluster(...)')")
        self._check_host(i)
        if not self.emulated:
            return list(argv)
        return ["ip", "netns", "exec", self.ns(i), *argv]

    def popen(self, i: int, argv: Sequence[str], env: dict | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` inside host ``i``; the cluster kills it on close.

        ``env`` is the complete environment (default: this process's). Each
        process gets its own session so that it and its children can be
        signalled as a group.
        """
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(i, argv), env=env, **kw)
        self._procs.append(p)
        return p

    def run(self, i: int, argv: Sequence[str], timeout: float = 60.0, check: bool = False,
            env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` in host ``i`` to completion (``subprocess.run`` semantics)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.command(i, argv), timeout=timeout, check=check, env=env, **kw)

    def qdisc_stats(self, i: int) -> str:
        """``tc -s qdisc`` of host i's interface: drops, overlimits, backlog."""
        if not self.emulated:
            return ""
        return _run(["ip", "netns", "exec", self.ns(i), "tc", "-s", "qdisc", "show", "dev", IFACE]).stdout

    def __repr__(self) -> str:
        mode = "netns" if self.emulated else "loopback"
        return f"EmulatedCluster(hosts={self.hosts}, rate={self.rate!r}, delay={self.delay!r}, loss={self.loss!r}, {mode}, prefix={self.prefix!r})"


def _terminate(p: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``grace`` seconds."""
    if p.poll() is not None:
        return
    try:
        pgid = os.getpgid(p.pid)
    except ProcessLookupError:
        return
    own = pgid != os.getpgid(0)
    try:
        if own:
            os.killpg(pgid, signal.SIGTERM)
        else:
            p.terminate()
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            if own:
                os.killpg(pgid, signal.SIGKILL)
            else:
                p.kill()
            p.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            log.warning("process %d did not die", p.pid)
    except ProcessLookupError:
        pass
