"""pushpull.metrics' endpoint over real HTTP on loopback: samples of one name that differ by a label (a server's
late and missing ranks, pushpull_server_rounds_awaiting{rank=...}) are one family that Prometheus parses."""
from __future__ import annotations

import socket
import urllib.request

import pytest

from pushpull import metrics

parser = pytest.importorskip("prometheus_client.openmetrics.parser", reason="prometheus_client is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_labelled_samples_of_one_name_are_one_family():
    port = _free_port()
    samples = [("pushpull_server_keys", "gauge", "keys", 3),
               ("pushpull_server_rounds_awaiting", "gauge", "waiting", 2, {"rank": "1"}),
               ("pushpull_server_rounds_awaiting", "gauge", "waiting", 5, {"rank": "3"}),
               ("pushpull_server_late_pushes_total", "counter", "late", 7)]
    handle = metrics.start("server", port, "127.0.0.1", lambda: samples, {"role": "server", "server": 0})
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        families = {f.name: f for f in parser.text_string_to_metric_families(
            urllib.request.urlopen(req, timeout=10).read().decode())}
    finally:
        metrics.stop(handle)
    awaiting = families["pushpull_server_rounds_awaiting"]
    assert {(s.labels["rank"], s.value) for s in awaiting.samples} == {("1", 2.0), ("3", 5.0)}
    assert all(s.labels["role"] == "server" for s in awaiting.samples)
    assert families["pushpull_server_late_pushes"].samples[0].value == 7.0
