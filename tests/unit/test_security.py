"""Security by default (docs/security.md) without processes: the mechanism per address, credentials that
depend on the secret, a warning for none. With real processes on loopback: tests/cluster/test_security.py."""
from __future__ import annotations

import pytest

from pushpull.config import load_config
from pushpull.transport.security import JobAuth, auth_for


def test_auth_none_warns(caplog):
    import pushpull.transport.security as sec

    sec._warned = False
    with caplog.at_level("WARNING"):
        assert auth_for(load_config({"PUSHPULL_AUTH": "none"}), "server") is None
    assert "PUSHPULL_AUTH=none" in caplog.text


@pytest.mark.parametrize("mode,host,want", [("auto", "127.0.0.1", "plain"), ("auto", "10.1.2.3", "curve"),
                                            ("curve", "127.0.0.1", "curve"), ("plain", "10.1.2.3", "plain")])
def test_mechanism_per_address(mode, host, want):
    assert JobAuth("s", mode).mechanism(host) == want


def test_credentials_depend_on_the_secret():
    a, b = JobAuth("one"), JobAuth("two")
    assert a.public_key != b.public_key and a.password != b.password
    assert JobAuth("one").public_key == a.public_key
