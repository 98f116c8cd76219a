"""The per-user local secret that authenticates a loopback-only job started without PUSHPULL_SECRET
(pushpull.transport.security.local_secret)."""
from __future__ import annotations

import os
import stat

import pytest

from pushpull.config import ConfigError, load_config
from pushpull.transport import security


@pytest.fixture
def secret_dir(tmp_path, monkeypatch):
    d = tmp_path / "pp"
    monkeypatch.setenv("PUSHPULL_LOCAL_SECRET_DIR", str(d))
    return d


def _cfg(**env):
    base = {"DMLC_PS_ROOT_URI": "127.0.0.1"}
    base.update(env)
    return load_config(base)


def test_made_once_private_and_stable(secret_dir):
    first = security.local_secret()
    assert len(first) >= 32
    assert security.local_secret() == first
    assert stat.S_IMODE((secret_dir / "local_secret").stat().st_mode) == 0o600
    assert stat.S_IMODE(secret_dir.stat().st_mode) == 0o700


def test_a_file_others_may_read_is_refused_naming_it(secret_dir):
    security.local_secret()
    os.chmod(secret_dir / "local_secret", 0o644)
    with pytest.raises(ConfigError, match="local_secret.*chmod 600"):
        security.local_secret()


def test_a_loopback_job_without_a_secret_uses_it(secret_dir):
    assert security.job_secret(_cfg()) == security.local_secret()


def test_the_job_secret_wins_over_it(secret_dir):
    assert security.job_secret(_cfg(PUSHPULL_SECRET="s3")) == "s3"
    assert not (secret_dir / "local_secret").exists()


@pytest.mark.parametrize("env", [{"DMLC_PS_ROOT_URI": "192.0.2.1"},
                                 {"DMLC_NODE_HOST": "192.0.2.7"},
                                 {"PUSHPULL_BIND_HOST": "*"},
                                 {"DMLC_INTERFACE": "eth0"}],
                         ids=["remote-scheduler", "remote-node-host", "bind-everywhere", "interface"])
def test_a_job_that_leaves_loopback_gets_none(secret_dir, env):
    assert security.job_secret(_cfg(**env)) is None
    assert not (secret_dir / "local_secret").exists()


def test_a_folder_others_may_open_is_refused(secret_dir):
    secret_dir.mkdir(mode=0o755)
    os.chmod(secret_dir, 0o755)
    with pytest.raises(ConfigError, match="folder.*chmod 700"):
        security.local_secret()


def test_a_symbolic_link_is_refused(secret_dir, tmp_path):
    """Someone else's link to a private file of ours would make that file's first line the secret."""
    secret_dir.mkdir(mode=0o700)
    target = tmp_path / "id_key"
    target.write_text("guessable first line\n")
    os.chmod(target, 0o600)
    (secret_dir / "local_secret").symlink_to(target)
    with pytest.raises(ConfigError, match="cannot be used"):
        security.local_secret()
