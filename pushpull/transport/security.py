"""Who may talk to a job: ZeroMQ's own security mechanisms, keyed by the job secret.

Why ZeroMQ's mechanisms: CURVE (CurveZMQ, ZeroMQ RFC 26: Curve25519 key
exchange, every frame encrypted and authenticated) and PLAIN with a ZAP
handler (ZeroMQ RFC 24/27) are part of libzmq, so the transport stays plain
ZeroMQ and no cryptography is written here.

How the secret becomes credentials: every node derives, with SHA-256 and a
label per use, one Curve25519 key pair and one PLAIN password from the secret.
Listening sockets (scheduler, servers) run pyzmq's ZAP authenticator, which
admits only a CURVE client whose long-term key is the job's (the handshake
makes the client prove it holds the private key) or a PLAIN client with the
job's password. A peer without the secret fails the handshake: its connection
is closed before any of its messages reaches pushpull, so it gets no reply.

Which mechanism (PUSHPULL_AUTH):
* ``auto`` (default): CURVE between machines; PLAIN on loopback, where no
  other machine can reach the port and only root can read the traffic, and
  where CURVE's encryption cut ``pushpull bench allreduce`` to a quarter
  (docs/security.md has the figures);
* ``curve``: CURVE everywhere; ``plain``: PLAIN everywhere (authentication
  without encryption: keeps out anyone who cannot read the job's packets, not
  an eavesdropper, who could replay the password); ``none``: no check.

What it does not do: tell one member from another. Every node holds the same
credentials, so a server also checks a message's ``sender`` against the rank
in its connection's identity (docs/security.md).
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import stat
import tempfile
import threading
from pathlib import Path

import zmq
from zmq.utils import z85

from pushpull.config import Config, ConfigError

log = logging.getLogger(__name__)

ZAP_DOMAIN = b"pushpull"
PLAIN_USER = b"pushpull"
HOW_TO_SET = ("set the same PUSHPULL_SECRET on every machine of the job (for example "
              "export PUSHPULL_SECRET=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')), or "
              "PUSHPULL_SECRET_FILE to a file holding it; PUSHPULL_AUTH=none turns authentication off "
              "(anyone who can reach the ports joins the job)")


def _derive(label: bytes, secret: str) -> bytes:
    return z85.encode(hashlib.sha256(b"pushpull " + label + b" v1\0" + secret.encode()).digest())


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class JobAuth:
    """The job's credentials and how to put them on sockets."""

    def __init__(self, secret: str, mode: str = "auto"):
        if not secret:
            raise ValueError("empty job secret")
        if mode not in ("auto", "curve", "plain"):
            raise ValueError(f"unknown authentication mode {mode!r}")
        self.mode = mode
        self.secret_key = _derive(b"curve key", secret)
        self.public_key = zmq.curve_public(self.secret_key)
        self.password = _derive(b"plain password", secret)
        # the direct lanes' HMAC key (pushpull.transport.lane): a label of its own, so it reveals no other credential
        self.lane_key = hashlib.sha256(b"pushpull lane key v1\0" + secret.encode()).digest()
        self._authenticators: dict[int, object] = {}
        self._lock = threading.Lock()

    def mechanism(self, host: str) -> str:
        """'curve' or 'plain' for a socket bound on, or connecting to, ``host``."""
        if self.mode == "auto":
            return "plain" if is_loopback(host) else "curve"
        return self.mode

    def lane_sealed(self, host: str) -> bool:
        """Whether the lanes (pushpull.transport.lane) of a server on ``host`` are encrypted
        (pushpull.transport.seal): wherever its ZeroMQ traffic is (CURVE), so a lane never downgrades it."""
        return self.mechanism(host) == "curve"

    def listen(self, sock: zmq.Socket, host: str) -> None:
        """Make ``sock`` (before it binds on ``host``) admit only job members."""
        self._authenticate(sock.context)
        sock.zap_domain = ZAP_DOMAIN
        if self.mechanism(host) == "curve":
            sock.curve_secretkey = self.secret_key
            sock.curve_publickey = self.public_key
            sock.curve_server = True
        else:
            sock.plain_server = True

    def connect(self, sock: zmq.Socket, host: str) -> None:
        """Give ``sock`` (before it connects to ``host``) the job's credentials."""
        if self.mechanism(host) == "curve":
            sock.curve_secretkey = self.secret_key
            sock.curve_publickey = self.public_key
            sock.curve_serverkey = self.public_key
        else:
            sock.plain_username = PLAIN_USER
            sock.plain_password = self.password

    def callback(self, domain: str, client_key: bytes) -> bool:
        """ZAP, CURVE: admit a client whose long-term key is the job's (constant-time comparison)."""
        ok = hmac.compare_digest(client_key, self.public_key)
        if not ok:
            log.warning("refused a connection whose key is not this job's (no PUSHPULL_SECRET, or another job's)")
        return ok

    def _authenticate(self, ctx: zmq.Context) -> None:
        # one ZAP handler per context, started before the first secured socket binds
        with self._lock:
            if id(ctx) in self._authenticators:
                return
            from zmq.auth.thread import ThreadAuthenticator

            auth = ThreadAuthenticator(ctx, log=logging.getLogger("pushpull.zap"))
            auth.start()
            auth.configure_curve_callback(domain=ZAP_DOMAIN.decode(), credentials_provider=self)
            auth.configure_plain(domain=ZAP_DOMAIN.decode(),
                                 passwords={PLAIN_USER.decode(): self.password.decode()})
            self._authenticators[id(ctx)] = auth

    def close(self, ctx: zmq.Context) -> None:
        """Stop the context's ZAP handler (before the context terminates)."""
        with self._lock:
            auth = self._authenticators.pop(id(ctx), None)
        if auth is not None:
            auth.stop()


def job_secret(cfg: Config) -> str | None:
    """PUSHPULL_SECRET, or the first line of PUSHPULL_SECRET_FILE; for a job confined to this machine's
    loopback with neither, this user's own local secret (:func:`local_secret`)."""
    if cfg.secret:
        return cfg.secret
    if cfg.secret_file:
        return _read_secret_file(cfg.secret_file, "PUSHPULL_SECRET_FILE")
    if loopback_only(cfg):
        return local_secret()
    return None


def _read_secret_file(path: str, what: str) -> str:
    try:
        text = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{what}={path!r} cannot be read: {e}") from None
    if not text or not text[0].strip():
        raise ConfigError(f"{what}={path!r} is empty")
    return text[0].strip()


def loopback_only(cfg: Config) -> bool:
    """Every address of the job is this machine's loopback: the scheduler's, and this node's own."""
    return is_loopback(cfg.root_uri) and (cfg.node_host is None or is_loopback(cfg.node_host)) \
        and (cfg.bind_host is None or is_loopback(cfg.bind_host)) and cfg.interface in (None, "lo")


def local_secret_path() -> Path:
    return Path(os.environ.get("PUSHPULL_LOCAL_SECRET_DIR") or Path.home() / ".pushpull") / "local_secret"


def local_secret() -> str:
    """A secret private to this user on this machine (a 0600 file in a 0700 folder, made on first use),
    for jobs that never leave loopback and name no secret, as BytePS's own tests and scripts start them
    (roles from DMLC_* variables alone). Why it is safe: a process that can read the file runs as this
    user (or root) and could read the job's environment anyway; other users' processes, which reach
    loopback ports too, cannot. Refused: a folder or file another user owns or others may open, and a file
    that is a symbolic link (someone else's link to a file of ours would make its first line the secret)."""
    path = local_secret_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _private(path.parent, os.lstat(path.parent), "folder", "chmod 700")
        if not path.exists() and not path.is_symlink():
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".local_secret.")  # 0600
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_urlsafe(32) + "\n")
                try:
                    os.link(tmp, path)  # atomic: of several first users, one file wins and all read it
                except FileExistsError:
                    pass
            finally:
                os.unlink(tmp)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # checked and read through one descriptor
        try:
            _private(path, os.fstat(fd), "file", "chmod 600")
            with os.fdopen(fd, "r") as f:
                fd = -1
                text = f.read().splitlines()
        finally:
            if fd >= 0:
                os.close(fd)
    except ConfigError:
        raise
    except OSError as e:
        raise ConfigError(f"no job secret, and this user's local secret {str(path)!r} cannot be used: {e}; "
                          f"{HOW_TO_SET}") from None
    if not text or not text[0].strip():
        raise ConfigError(f"the local secret {str(path)!r} is empty; delete it (it is made again) or {HOW_TO_SET}")
    global _told_local
    if not _told_local:
        log.info("no PUSHPULL_SECRET: this loopback-only job authenticates with the local secret in %s", path)
        _told_local = True
    return text[0].strip()


def _private(path: Path, st: os.stat_result, what: str, fix: str) -> None:
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"the local secret's {what} {str(path)!r} is owned by uid {st.st_uid} with mode "
                          f"{stat.filemode(st.st_mode)}; it must be this user's (uid {os.geteuid()}) and open to "
                          f"nobody else ({fix}), or {HOW_TO_SET}")


_told_local = False
_warned = False


def auth_for(cfg: Config, who: str) -> JobAuth | None:
    """This job's credentials, or None with PUSHPULL_AUTH=none (warned once per process). A node of a
    job that asks for authentication but has no secret fails at start-up, naming the fix."""
    global _warned
    if cfg.auth == "none":
        if not _warned:
            log.warning("PUSHPULL_AUTH=none: the %s accepts any peer that reaches its port; use it only on a "
                        "network nobody else can reach (docs/security.md)", who)
            _warned = True
        return None
    secret = job_secret(cfg)
    if not secret:
        raise ConfigError(f"the {who} has no job secret (PUSHPULL_AUTH={cfg.auth}): {HOW_TO_SET}")
    return JobAuth(secret, cfg.auth)
