"""``pushpull launch`` (alias ``bpslaunch``).

Local: ``pushpull launch --workers N --servers K -- CMD ...`` starts the
scheduler, K servers and N copies of CMD on this machine, prefixes every output
line with the process's role and rank, and when any process fails stops all
the others and exits non-zero naming the culprit. Ctrl-C leaves nothing behind:
every child runs in its own process group, which is killed as a whole.

BytePS style: with ``DMLC_ROLE`` set (and no ``--workers``) it starts just that
role: the scheduler or a server in-process, or, for a worker machine,
``BYTEPS_LOCAL_SIZE`` (or one per visible GPU) copies of CMD.
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from pushpull.cli import help_text
from pushpull.config import DEFAULTS, env_source, setting

GRACE_S = 3.0
BLAME_WAIT_S = 0.5  # after a failure, how long to wait for a line naming its cause
CULPRIT = re.compile(r"pushpull-culprit pid=(\d+): (.*)")  # printed by a node whose failure another one caused
_LAUNCHER_PID = os.getpid()


RESTART_DELAY_S = 1.0  # --restart-workers: a replacement starts this long after its worker was lost
SCHEDULER_RESTART_DELAY_S = 0.5  # --restart-scheduler: the new scheduler starts this long after the loss
SCHEDULER_RECOVERY_S = 30  # --restart-scheduler: how long nodes wait for it (PUSHPULL_SCHEDULER_RECOVERY)


@dataclass
class Child:
    label: str
    proc: subprocess.Popen
    is_worker: bool
    reader: threading.Thread | None = None
    argv: list | None = None  # how it was started (a lost worker's replacement starts the same way)
    env: dict | None = None


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies, however it dies (SIGKILL included), so a
    job never runs on unsupervised (Linux prctl PR_SET_PDEATHSIG; elsewhere a no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if os.getppid() != _LAUNCHER_PID:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Starts children, relays their output, and tears everything down on failure."""

    def __init__(self, prefix_output: bool = True, min_workers: int = 0, restart_workers: int = 0,
                 restart_scheduler: int = 0, restart_servers: int = 0):
        self.children: list[Child] = []
        self.scheduler_restarts_left = restart_scheduler  # a lost scheduler started again, at most this many times
        self.min_workers = min_workers  # elastic: workers may die while at least this many remain
        self.restarts_left = restart_workers  # elastic: lost workers replaced, at most this many in all
        self.server_restarts_left = restart_servers  # elastic: lost servers replaced, at most this many in all
        self._restart_at: list[tuple[float, Child]] = []  # (when, the lost worker or server) replacements due
        self.lost: list[Child] = []
        self.prefix_output = prefix_output
        self.out_lock = threading.Lock()
        self._stopping = False
        self.blamed: dict[int, str] = {}  # pid -> why other nodes say it failed (CULPRIT lines)

    def start(self, label: str, argv: list[str], env: dict, is_worker: bool) -> Child:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        child = Child(label, proc, is_worker, argv=list(argv), env=dict(env))
        child.reader = threading.Thread(target=self._relay, args=(child,), daemon=True)
        child.reader.start()
        self.children.append(child)
        return child

    def _relay(self, child: Child) -> None:
        assert child.proc.stdout is not None
        for raw in iter(child.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            m = CULPRIT.search(line)
            if m:  # a node says which process its failure comes from
                self.blamed.setdefault(int(m.group(1)), m.group(2))
            with self.out_lock:
                if self.prefix_output:
                    print(f"[{child.label}] {line}", flush=True)
                else:
                    print(line, flush=True)

    def _blame(self, first: Child, code: int) -> str:
        """Name the process that failed first by cause, not by exit order: the first to exit is often a
        healthy worker that learnt of another node's death (a frozen server does not exit at all)."""
        deadline = time.monotonic() + BLAME_WAIT_S
        while time.monotonic() < deadline and not any(c.proc.pid in self.blamed for c in self.children):
            time.sleep(0.02)  # the relays may still be reading the lines that name the culprit
        exited = f"{first.label} (pid {first.proc.pid}) exited with {_signal_name(code)}"
        for c in self.children:
            if c is not first and c not in self.lost and c.proc.pid in self.blamed:
                state = "still running (hung?)" if c.proc.poll() is None else f"exited with {_signal_name(c.proc.returncode)}"
                return (f"{c.label} (pid {c.proc.pid}) failed first: {self.blamed[c.proc.pid]} [{state}]; "
                        f"{exited} because of it; stopping the others")
        return f"{exited}; stopping the others"

    def _running_workers(self) -> list[Child]:
        return [w for w in self.children if w.is_worker and w not in self.lost and w.proc.poll() is None]

    def _restart_scheduler(self, lost: Child, code: int) -> bool:
        """--restart-scheduler: start a new scheduler at the same address (the same command and environment,
        PUSHPULL_SCHEDULER_RECOVER=1), which takes the running job over from the nodes that register again."""
        if self.scheduler_restarts_left <= 0 or not self._running_workers() or code >= 0:
            return False  # an orderly exit with an error (the job failed, a takeover failed) is no loss to repair
        self.scheduler_restarts_left -= 1
        self.lost.append(lost)
        time.sleep(SCHEDULER_RESTART_DELAY_S)
        n = sum(1 for c in self.children if c.label.startswith("scheduler"))
        new = self.start(f"scheduler (restart {n})", lost.argv, dict(lost.env, PUSHPULL_SCHEDULER_RECOVER="1"), False)
        self.say(f"{lost.label} (pid {lost.proc.pid}) exited with {_signal_name(code)}; started {new.label} "
                 f"(pid {new.proc.pid}), which takes the running job over (--restart-scheduler)")
        return True

    def _kill_hung(self) -> None:
        """A process the job named and goes on without is ended rather than waited for: a scheduler the nodes
        name as hung (silent past PUSHPULL_HEARTBEAT_TIMEOUT: stopped, say) under --restart-scheduler (its exit
        starts the new one), and in an elastic job a worker or server the scheduler dropped (its exit counts
        as the loss, and a lost worker is replaced under --restart-workers)."""
        for c in self.children:
            if c in self.lost or c.proc.pid not in self.blamed or c.proc.poll() is not None:
                continue
            is_scheduler = c.label.startswith("scheduler")
            if (is_scheduler and self.scheduler_restarts_left > 0) or \
                    (not is_scheduler and self.min_workers and "dropped from the job" in self.blamed[c.proc.pid]):
                self.say(f"{c.label} (pid {c.proc.pid}) is hung ({self.blamed.pop(c.proc.pid)}); killing it")
                try:
                    os.killpg(c.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _start_due_replacements(self) -> None:
        """--restart-workers, --restart-servers: start a lost worker's or server's replacement, the same command
        and environment, which joins the running job (a worker as its last rank, a server in the lost one's
        place: docs/elastic.md); not once the workers have finished."""
        now = time.monotonic()
        for item in [r for r in self._restart_at if r[0] <= now]:
            self._restart_at.remove(item)
            lost = item[1]
            if not self._running_workers():
                continue
            base = lost.label.split(" (")[0]  # "worker 1", "server 0": its replacements are numbered on
            n = sum(1 for c in self.children if c.label.split(" (")[0] == base)
            new = self.start(f"{base} (replacement {n})", lost.argv, lost.env, lost.is_worker)
            self.say(f"started {new.label} (pid {new.proc.pid}) for {lost.label}; it joins the running job")

    def say(self, text: str) -> None:
        with self.out_lock:
            print(f"pushpull launch: {text}", file=sys.stderr, flush=True)

    def kill_all(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        alive = [c for c in self.children if c.proc.poll() is None]
        for c in alive:
            try:
                os.killpg(c.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + GRACE_S
        for c in alive:
            try:
                c.proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for c in self.children:
            try:  # the whole group: also grandchildren a command may have left
                os.killpg(c.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                c.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
        for c in self.children:
            if c.reader:
                c.reader.join(1)

    def supervise(self, finish_timeout: float = 30.0) -> int:
        """Wait until all workers succeed (0) or anything fails (its code)."""
        workers_done_at = None
        try:
            while True:
                for c in self.children:
                    code = c.proc.poll()
                    if code is None:
                        continue
                    if code != 0 and c in self.lost:
                        continue
                    if code != 0 and c.is_worker and self.min_workers:
                        left = [w for w in self.children if w.is_worker and w not in self.lost and w is not c]
                        if len(left) >= self.min_workers:  # elastic: the scheduler goes on without it
                            self.lost.append(c)
                            self.say(f"{c.label} (pid {c.proc.pid}) exited with {_signal_name(code)}; going on "
                                     f"with {len(left)} workers (--min-workers {self.min_workers})")
                            if self.restarts_left > 0:
                                self.restarts_left -= 1
                                # after the scheduler has let it go (its connection closed: milliseconds)
                                self._restart_at.append((time.monotonic() + RESTART_DELAY_S, c))
                            continue
                    if code != 0 and c.label.startswith("server") and self.min_workers:
                        left = [x for x in self.children if x.label.startswith("server") and x not in self.lost
                                and x is not c]
                        if left:  # elastic: its partitions move to the other servers
                            self.lost.append(c)
                            self.say(f"{c.label} (pid {c.proc.pid}) exited with {_signal_name(code)}; going on "
                                     f"with {len(left)} server(s), which take its partitions")
                            if self.server_restarts_left > 0:
                                self.server_restarts_left -= 1
                                self._restart_at.append((time.monotonic() + RESTART_DELAY_S, c))
                            continue
                    if code != 0 and c.label.startswith("scheduler") and self._restart_scheduler(c, code):
                        continue
                    if code != 0:
                        # servers and the scheduler exit 0 only once every worker said FINISH
                        self.say(self._blame(c, code))
                        self.kill_all()
                        return code if code > 0 else 128 + (-code)
                self._start_due_replacements()
                self._kill_hung()
                workers = [c for c in self.children if c.is_worker and c not in self.lost]
                if workers_done_at is None and all(w.proc.poll() == 0 for w in workers):
                    workers_done_at = time.monotonic()
                if workers_done_at is not None:
                    if all(c.proc.poll() is not None for c in self.children):
                        for c in self.children:
                            if c.reader:
                                c.reader.join(1)
                        return 0
                    if time.monotonic() - workers_done_at > finish_timeout:
                        self.say("servers/scheduler did not exit after the workers finished; killing them")
                        self.kill_all()
                        return 0
                time.sleep(0.05)
        except KeyboardInterrupt:
            self.say("interrupted; stopping every process")
            self.kill_all()
            return 130


def _base_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def ensure_job_secret(env: dict) -> None:
    """A launcher that starts every process of a job gives them a fresh secret, unless the user set one
    or turned authentication off (docs/security.md); children read it from their environment."""
    auth = env.get("PUSHPULL_AUTH", DEFAULTS.auth).strip().lower()
    if auth != "none" and not env.get("PUSHPULL_SECRET") and not env.get("PUSHPULL_SECRET_FILE"):
        env["PUSHPULL_SECRET"] = secrets.token_urlsafe(32)


def launch_local(workers: int, servers: int, cmd: list[str], port: int | None = None,
                 env_extra: dict | None = None, prefix_output: bool = True, min_workers: int = 0,
                 restart_workers: int = 0, restart_scheduler: int = 0, restart_servers: int = 0) -> int:
    """Scheduler + ``servers`` servers + ``workers`` copies of ``cmd`` on this machine (elastic with
    ``min_workers`` > 0: the job goes on while that many workers are alive)."""
    port = port or free_port()
    common = _base_env(env_extra)
    if min_workers:
        common["PUSHPULL_MIN_WORKERS"] = str(min_workers)
    for k in ("DMLC_ROLE", "PUSHPULL_ROLE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
              "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):  # each child gets its own DMLC_ROLE
        common.pop(k, None)
    # like torchrun: N workers each with an OpenMP pool as large as the machine
    # oversubscribe the cores many times over (15x slower seen on 2 cores)
    common.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    # the same for the servers' summation threads: BytePS' 4 per server assume a machine of their own;
    # here they share the cores with the workers (4 per server on 2 cores: about 10 % slower, GIL hand-offs)
    if not any(k in common for k in ("PUSHPULL_SERVER_ENGINE_THREAD", "BYTEPS_SERVER_ENGINE_THREAD")):
        common["PUSHPULL_SERVER_ENGINE_THREAD"] = str(max(1, min(4, (os.cpu_count() or 1) // (workers + servers))))
    ensure_job_secret(common)
    common.setdefault("PUSHPULL_SHUTDOWN", "keep")  # this launcher owns the job's life: init() may follow shutdown()
    common.update({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_WORKER": "1",
                   "DMLC_NUM_SERVER": str(servers), "DMLC_WORKER_ID": "0", "BYTEPS_LOCAL_SIZE": str(workers),
                   "DMLC_NODE_HOST": "127.0.0.1"})
    if restart_scheduler:
        common.setdefault("PUSHPULL_SCHEDULER_RECOVERY", str(SCHEDULER_RECOVERY_S))
    sup = Supervisor(prefix_output, min_workers, restart_workers, restart_scheduler, restart_servers)
    _install_term_handler(sup)
    py = sys.executable
    need_cluster = workers > 1 or common.get("BYTEPS_FORCE_DISTRIBUTED", "0") not in ("0", "")
    try:
        if need_cluster:
            if servers < 1:
                sup.say(f"{workers} workers need at least one server (--servers K)")
                return 2
            sup.start("scheduler", [py, "-m", "pushpull.launch.role", "scheduler"],
                      dict(common, DMLC_ROLE="scheduler"), False)
            for s in range(servers):
                sup.start(f"server {s}", [py, "-m", "pushpull.launch.role", "server"],
                          dict(common, DMLC_ROLE="server"), False)
        for w in range(workers):
            sup.start(f"worker {w}", cmd, dict(common, DMLC_ROLE="worker", BYTEPS_LOCAL_RANK=str(w)), True)
        return sup.supervise()
    finally:
        sup.kill_all()


def _install_term_handler(sup: Supervisor) -> None:
    def on_term(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)


def launch_role(cmd: list[str]) -> int:
    """BytePS style: start the role named by PUSHPULL_ROLE or DMLC_ROLE (the former wins, as in the config)."""
    var, raw = env_source("role") or ("DMLC_ROLE", "")
    role = raw.strip().lower()
    if role in ("scheduler", "server"):
        from pushpull.launch.role import run_role

        return run_role(role)
    if role != "worker":
        print(f"pushpull launch: {var}={raw!r} is invalid; {var} accepts {setting('role').accepts}",
              file=sys.stderr)
        return 2
    if not cmd:
        print("pushpull launch: a worker needs a command to run (pushpull launch -- python train.py)",
              file=sys.stderr)
        return 2
    # worker id and local size as the workers' config reads them (PUSHPULL_* or the BytePS names)
    wid = (env_source("worker_id") or ("", ""))[1] or "0"
    if any(k in os.environ for k in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")) \
            and env_source("worker_id") is None:
        # torchrun / SLURM / mpirun already started one process per device
        return subprocess.call(cmd)
    local_size = (env_source("local_size") or ("", ""))[1]
    if not local_size:
        visible = os.environ.get("NVIDIA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
        local_size = str(len([d for d in visible.split(",") if d.strip()])) if visible and visible != "all" else "1"
    n = int(local_size)
    sup = Supervisor(prefix_output=n > 1)
    _install_term_handler(sup)
    try:
        for i in range(n):
            env = _base_env({"BYTEPS_LOCAL_SIZE": str(n), "BYTEPS_LOCAL_RANK": str(i)})
            for k in ("PUSHPULL_LOCAL_SIZE", "PUSHPULL_LOCAL_RANK"):  # they would win over the values set here
                env.pop(k, None)
            sup.start(f"worker {int(wid) * n + i}", cmd, env, True)
        return sup.supervise()
    finally:
        sup.kill_all()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="pushpull launch", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", "-n", type=int, help="worker processes to start on this machine")
    p.add_argument("--servers", "-k", type=int, default=None, help="server processes (default: 1)")
    p.add_argument("--port", type=int, default=None, help="scheduler port (default: a free one)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment for every process")
    p.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with role and rank")
    p.add_argument("--min-workers", type=int, default=0,
                   help="elastic training: go on while at least this many workers are alive (docs/elastic.md)")
    p.add_argument("--restart-workers", type=int, default=0, metavar="N",
                   help="elastic training (with --min-workers): start a replacement for a lost worker, N times "
                        "at most in all; it joins the running job (docs/elastic.md)")
    p.add_argument("--restart-servers", type=int, default=0, metavar="N",
                   help="elastic training (with --min-workers): start a replacement for a lost server, N times at "
                        "most in all; it takes the lost one's place and a share of the partitions (docs/elastic.md)")
    p.add_argument("--restart-scheduler", type=int, default=0, metavar="N",
                   help="start a lost scheduler again at the same address, N times at most; the nodes keep "
                        "training meanwhile and register with the new one (docs/elastic.md)")
    p.add_argument("command", nargs="*", help="the worker command (put it after --)")
    dashdash = bool(cmd)
    args, unknown = p.parse_known_args(argv)
    if unknown:
        hint = "" if dashdash else ("; if they belong to the worker command, put -- before it: "
                                    "pushpull launch --workers N --servers K -- python train.py --epochs 3")
        p.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    cmd = args.command + cmd
    extra = {}
    for kv in args.env:
        if "=" not in kv:
            p.error(f"--env {kv!r}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        extra[k] = v
    if args.workers is None and (env_source("role") or ("", ""))[1]:
        return launch_role(cmd)
    workers = args.workers if args.workers is not None else 1
    if workers < 1:
        p.error("--workers must be >= 1")
    servers = args.servers if args.servers is not None else 1
    if servers < 0:
        p.error("--servers must be >= 0")
    if not cmd:
        p.error("no command: pushpull launch --workers N --servers K -- python train.py")
    if shutil.which(cmd[0]) is None:
        p.error(f"the worker command {cmd[0]!r} was not found (not an executable file, not on PATH)")
    if args.min_workers < 0 or args.min_workers > workers:
        p.error(f"--min-workers must be between 0 and --workers ({workers})")
    if args.restart_workers < 0 or (args.restart_workers and not args.min_workers):
        p.error("--restart-workers N needs --min-workers M (a replacement joins an elastic job) and N >= 0")
    if args.restart_servers < 0 or (args.restart_servers and not args.min_workers):
        p.error("--restart-servers N needs --min-workers M (a replacement joins an elastic job) and N >= 0")
    if args.restart_scheduler < 0:
        p.error("--restart-scheduler N needs N >= 0")
    return launch_local(workers, servers, cmd, args.port, extra, not args.no_prefix, args.min_workers,
                        args.restart_workers, args.restart_scheduler, args.restart_servers)


def bpslaunch_main() -> None:
    sys.exit(main())
