"""Emulated cluster: shaping accuracy, cleanup in every exit path, fallback, jobs.

The namespace tests need root and iproute2; they skip with the reason
otherwise. The loopback-fallback tests run everywhere.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time

from pathlib import Path

import pytest

from pushpull.emulate import measure
from pushpull.emulate.jobs import JobError, launch_job, launch_torch_job, launch_torchrun_job
from pushpull.emulate.netns import (EmulatedCluster, cleanup, congestion_selectable, list_namespaces,
                                    netem_available, netns_unavailable_reason)

REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")


def _ns_with(prefix: str) -> list[str]:
    return [n for n in list_namespaces() if n.startswith(prefix)]


def _root_links_with(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10).stdout
    return [line for line in out.splitlines() if prefix in line]


@needs_netns
def test_rate_matches_configured():
    with EmulatedCluster(2, rate="200mbit") as c:
        assert c.emulated
        r = measure.throughput(c, 0, 1, seconds=2.5)
    got = r["bits_per_s"]
    # TCP goodput: within 10 % of the link rate (headers alone cost 4.4 %)
    assert 180e6 <= got <= 220e6, f"measured {got / 1e6:.1f} Mbit/s for a 200 Mbit/s link"
    assert r["bytes"] > 40e6  # a 2-3 s transfer, not a burst


@needs_netns
def test_hosts_run_the_chosen_congestion_control():
    """Every host runs cubic by default, whatever the machine's own setting; None inherits it."""
    cc = "/proc/sys/net/ipv4/tcp_congestion_control"
    if "cubic" not in open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split():
        pytest.skip("this kernel has no cubic")
    if not congestion_selectable("cubic"):
        pytest.skip("net.ipv4.tcp_allowed_congestion_control does not let a namespace pick cubic")
    mine = open(cc).read().strip()
    with EmulatedCluster(2, rate="100mbit") as c:
        got = [c.run(i, ["cat", cc], timeout=10).stdout.strip() for i in range(2)]
    assert got == ["cubic", "cubic"]
    with EmulatedCluster(1, rate="100mbit", congestion=None) as c:
        assert c.run(0, ["cat", cc], timeout=10).stdout.strip() == mine


@needs_netns
def test_a_congestion_control_the_machine_does_not_allow_is_reported_not_claimed(tmp_path, monkeypatch, caplog):
    """A fresh machine often lets namespaces pick only its default and reno: the hosts then keep the
    machine's, a warning says how to allow the one asked for, and congestion_in_force (what grid rows
    record) is what they really run."""
    from pushpull.emulate import netns

    allowed = tmp_path / "allowed"
    allowed.write_text("reno\n")  # as if only reno were allowed
    monkeypatch.setattr(netns, "ALLOWED_CC", str(allowed))
    mine = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    with caplog.at_level("WARNING"), EmulatedCluster(1, rate="100mbit", congestion="cubic") as c:
        got = c.run(0, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], timeout=10).stdout.strip()
        assert got == mine and c.congestion_in_force == mine
    assert "tcp_allowed_congestion_control" in caplog.text and "sysctl -w" in caplog.text


@needs_netns
def test_delay_adds_rtt():
    if not netem_available() and shutil.which("iptables") is None:
        pytest.skip("no sch_netem and no iptables for the NFQUEUE delayer")
    with EmulatedCluster(2, rate=None, delay="5ms") as c:
        got = measure.rtt(c, 0, 1, count=20)["rtt_median_s"]
    # one-way 5 ms each way: RTT 10 ms; the emulator may add a fraction of a ms
    assert 9.5e-3 <= got <= 11.5e-3, f"RTT {got * 1e3:.2f} ms, configured 10 ms"


@needs_netns
def test_cleanup_after_normal_exit_and_exception():
    c = EmulatedCluster(3, rate="100mbit")
    with c:
        assert len(_ns_with(c.prefix)) == 4  # 3 hosts + switch
        out = c.run(1, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"], timeout=10).stdout
        assert c.addr(1) in out
        assert "UP" in c.run(1, ["ip", "-o", "link", "show", "lo"], timeout=10).stdout  # lo is up
    assert _ns_with(c.prefix) == []
    assert _root_links_with(c.prefix) == []

    c2 = EmulatedCluster(2, rate="100mbit")
    with pytest.raises(RuntimeError, match="boom"):
        with c2:
            sleeper = c2.popen(0, ["sleep", "30"])
            raise RuntimeError("boom")
    assert _ns_with(c2.prefix) == []
    assert sleeper.poll() is not None  # processes started in the cluster are gone too
    assert _root_links_with(c2.prefix) == []


SCRIPT = textwrap.dedent("""
    import sys, time
    from pushpull.emulate.netns import EmulatedCluster
    with EmulatedCluster(2, rate="100mbit") as c:
        print(c.prefix, flush=True)
        c.popen(0, ["sleep", "60"])
        time.sleep(60)
""")


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cleanup_on_signal(sig):
    p = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        prefix = p.stdout.readline().strip()
        assert prefix.startswith("ppx"), prefix
        assert len(_ns_with(prefix)) == 3
        p.send_signal(sig)
        p.wait(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert _ns_with(prefix) == []


@needs_netns
def test_cleanup_removes_leftovers_of_dead_runs_only():
    dead = 4194303 + 1  # above pid_max's ceiling: no such process
    stale = f"ppx{dead:x}a-h0"
    live = f"ppx{1:x}a-h0"  # pid 1 is alive
    for ns in (stale, live):
        subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        removed = cleanup()
        assert stale in removed and live not in removed
        assert live in list_namespaces()
        # limited to the test's own name: other live clusters on this machine must survive the test
        assert cleanup(prefix=live, include_live=True) == [live]
    finally:
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    assert stale not in list_namespaces() and live not in list_namespaces()


def test_loopback_fallback():
    with EmulatedCluster(2, rate="200mbit", delay="1ms", force_loopback=True) as c:
        assert not c.emulated
        assert c.addr(0) == c.addr(1) == "127.0.0.1"
        assert c.command(1, ["true"]) == ["true"]  # runs directly, no ip netns exec
        out = c.run(1, [sys.executable, "-c", "print('hi')"], timeout=30).stdout
        assert out.strip() == "hi"
        r = measure.throughput(c, 0, 1, seconds=0.3)
        assert r["bits_per_s"] > 0
    assert c.prefix not in " ".join(list_namespaces())


STANDIN = textwrap.dedent("""
    # stand-in for `python -m pushpull launch`: report the environment and
    # which local address reaches the scheduler
    import json, os, socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((os.environ["DMLC_PS_ROOT_URI"], 9))
    env = {k: v for k, v in os.environ.items() if k.startswith(("DMLC_", "BYTEPS_"))}
    print(json.dumps({"env": env, "local": s.getsockname()[0], "argv": sys.argv[1:]}))
""")


@pytest.mark.parametrize("emulated", [pytest.param(True, marks=needs_netns), False])
def test_launch_job_environment(tmp_path, emulated):
    standin = tmp_path / "standin.py"
    standin.write_text(STANDIN)
    with EmulatedCluster(4, rate="1gbit", force_loopback=not emulated) as c:
        job = launch_job(c, 2, 2, ["python", "train.py"], placement="separate", env={"BYTEPS_X": "1"},
                         launcher=[sys.executable, str(standin)], log_dir=tmp_path / "logs")
        job.wait(30)
        info = {p.label: (p.host, json.loads(p.tail().strip().splitlines()[-1])) for p in job.procs}
        assert set(info) == {"scheduler", "server0", "server1", "worker0", "worker1"}
        for label, (host, d) in info.items():
            e = d["env"]
            assert e["DMLC_ROLE"] == label.rstrip("0123456789")
            assert e["DMLC_PS_ROOT_URI"] == c.addr(0)
            assert e["DMLC_NUM_WORKER"] == "2" and e["DMLC_NUM_SERVER"] == "2"
            assert e["DMLC_NODE_HOST"] == c.addr(host) == d["local"]  # really runs on that host
            assert e["BYTEPS_X"] == "1"
        assert [info[f"worker{i}"][0] for i in range(2)] == [0, 1]
        assert [info[f"server{j}"][0] for j in range(2)] == [2, 3]  # separate server machines
        assert info["worker1"][1]["env"]["DMLC_WORKER_ID"] == "1"
        assert info["worker0"][1]["argv"] == ["--", "python", "train.py"]
        assert info["scheduler"][1]["argv"] == []


def test_job_failure_kills_the_rest(tmp_path):
    with EmulatedCluster(2, force_loopback=True) as c:
        job = launch_torch_job(c, 2, [sys.executable, "-c",
                                      "import os, sys, time; sys.exit(3) if os.environ['RANK'] == '1' "
                                      "else time.sleep(60)"], log_dir=tmp_path)
        t = time.monotonic()
        with pytest.raises(JobError, match="rank1 .*exit code 3"):
            job.wait(30)
        assert time.monotonic() - t < 10
        assert job["rank0"].popen.poll() is not None


PP_WORKER = textwrap.dedent("""
    import torch, pushpull.torch as bps
    bps.init()
    out = bps.push_pull(torch.full((1000,), float(bps.rank() + 1)), average=False, name="x")
    assert out[0].item() == sum(range(1, bps.size() + 1)), out[0].item()
    print("ok", bps.rank(), flush=True)
    bps.shutdown()
""")

TORCH_WORKER = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert t[0].item() == sum(range(1, dist.get_world_size() + 1))
    print("ok", dist.get_rank(), flush=True)
    dist.destroy_process_group()
""")


@needs_netns
def test_pushpull_and_torch_jobs_across_hosts(tmp_path):
    (tmp_path / "pp.py").write_text(PP_WORKER)
    (tmp_path / "td.py").write_text(TORCH_WORKER)
    with EmulatedCluster(2, rate="1gbit") as c:
        job = launch_job(c, 2, 2, [sys.executable, str(tmp_path / "pp.py")], log_dir=tmp_path / "pp")
        job.wait(60)
        assert all("ok" in job[f"worker{i}"].tail() for i in range(2))
        job = launch_torch_job(c, 2, [sys.executable, str(tmp_path / "td.py")], log_dir=tmp_path / "td")
        job.wait(60)
        assert all("ok" in job[f"rank{i}"].tail() for i in range(2))


@needs_netns
def test_plain_multinode_torchrun_trains_across_hosts(tmp_path):
    """torchrun on two emulated hosts, no BytePS roles: pushpull starts its own scheduler and servers."""
    example = str(Path(__file__).resolve().parents[2] / "examples" / "train_digits.py")
    with EmulatedCluster(2, rate="1gbit") as c:
        job = launch_torchrun_job(c, 2, 1, [example, "--epochs", "3", "--no-progress", "--min-accuracy", "0.8"],
                                  log_dir=tmp_path / "tr")
        job.wait(180)
        tail = job["node0"].tail()
        assert "final: test_accuracy=" in tail and "workers=2" in tail, tail


def test_cli_check_and_cleanup_run():
    from pushpull.emulate.cli import main

    assert main(["cleanup"]) == 0
    assert main(["check"]) in (0, 1)
