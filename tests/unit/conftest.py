"""Keeps tests/unit what it says: a unit test that starts a process or opens a socket fails, naming what
it started, so a test that needs them is written in tests/cluster instead (tests/README.md)."""
from __future__ import annotations

import multiprocessing.process
import os
import platform
import socket
import subprocess

import pytest
import zmq

platform.uname().processor  # cached now: on Linux the first call runs `uname -p` (benchmarks report the CPU)


@pytest.fixture(autouse=True)
def _no_processes_or_sockets(request, monkeypatch):
    def refuse(what: str):
        def call(*args, **kwargs):
            raise AssertionError(f"{request.node.nodeid} {what}: a unit test starts no process and opens no "
                                 f"socket; move it to tests/cluster/ (tests/README.md)")
        return call

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("started a process (subprocess)"))
    monkeypatch.setattr(os, "fork", refuse("forked"))
    monkeypatch.setattr(os, "posix_spawn", refuse("started a process (posix_spawn)"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("started a process (multiprocessing)"))
    monkeypatch.setattr(socket.socket, "__init__", refuse("opened a socket"))
    monkeypatch.setattr(zmq.Context, "socket", refuse("opened a ZeroMQ socket"))
