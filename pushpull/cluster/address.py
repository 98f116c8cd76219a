"""Which address a node advertises and which one it listens on.

Why bind the advertised address and not every interface: a port opened on
0.0.0.0 is reachable from every network the machine is on, including ones the
job never uses; the address a node tells the others is the only one they need.
``PUSHPULL_BIND_HOST`` overrides it where the two differ (behind NAT, in some
containers).
"""
from __future__ import annotations

import fcntl
import logging
import socket
import struct

from pushpull.config import Config, ConfigError

log = logging.getLogger(__name__)

_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (DMLC_INTERFACE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise ConfigError(f"DMLC_INTERFACE={name!r}: no IPv4 address on that interface ({e.strerror})") from None
    return socket.inet_ntoa(packed[20:24])


def advertised_host(cfg: Config) -> str:
    """The address other nodes should use to reach this one: DMLC_NODE_HOST, else DMLC_INTERFACE's
    address, else loopback for a job on loopback, else the local end of the route to the scheduler."""
    if cfg.node_host:
        return cfg.node_host
    if cfg.interface:
        return interface_address(cfg.interface)
    if cfg.root_uri in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((cfg.root_uri, cfg.root_port))
        return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    finally:
        s.close()


def scheduler_host(cfg: Config) -> str:
    """The scheduler is reached at DMLC_PS_ROOT_URI, so that is what it advertises."""
    return cfg.root_uri


def bind_host(cfg: Config, advertised: str) -> str:
    """Where to listen: PUSHPULL_BIND_HOST if set, else the advertised address (resolved to an IP)."""
    host = cfg.bind_host or advertised
    if host in ("*", "0.0.0.0"):
        log.warning("PUSHPULL_BIND_HOST=%s: listening on every interface, not only the advertised %s",
                    host, advertised)
        return "*"
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise ConfigError(f"cannot resolve {host!r} to listen on ({e}); set PUSHPULL_BIND_HOST") from None


def bind_error(host: str, port: int, err: Exception) -> ConfigError:
    return ConfigError(f"cannot listen on {host}:{port} ({err}): it is not an address of this machine? Set "
                       f"DMLC_NODE_HOST / DMLC_PS_ROOT_URI to one, or PUSHPULL_BIND_HOST to the local address "
                       f"the advertised one is forwarded to")


def server_address(server: dict, local_ipc: bool) -> str:
    """Where a worker sends its pushes and pulls for ``server`` (its address book entry): the abstract Unix
    socket the server offers (``ipc``, Van.bind_ipc) unless PUSHPULL_LOCAL_IPC=0 here, when the server is on
    this worker's host, else its TCP port.

    On this host means: on loopback, or, for a server advertised at another address (a colocated server of a
    multi-machine job), its abstract socket answers a connect from here. An abstract socket belongs to the
    network namespace, so a worker that can connect to it shares the server's host; a ZeroMQ connect to a name
    nobody listens on would wait forever instead of failing, hence the probe."""
    if local_ipc and server.get("ipc"):
        ipc = str(server["ipc"])
        if str(server.get("host", "")).startswith("127.") or server.get("host") == "localhost" or _answers(ipc):
            return ipc
    return f"tcp://{server['host']}:{server['port']}"


def _answers(ipc: str) -> bool:
    """Whether an ``ipc://@NAME`` abstract socket is listening in this network namespace."""
    if not ipc.startswith("ipc://@"):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect("\0" + ipc[len("ipc://@"):])
        return True
    except OSError:
        return False
    finally:
        s.close()
