"""The warning for a hand-set key size with too few keys per server (pushpull.worker.keycheck)."""
from __future__ import annotations

import math

import pytest

from pushpull.config import default_partition_bytes
from pushpull.worker.keycheck import MIN_KEYS_PER_SERVER, few_keys_warning, keys_per_server

MB8 = [500_000] * 16          # the 100 Mbit/s grid's case: 16 tensors of 500 KB


def test_keys_per_server_counts_bytes_over_the_largest_key():
    assert keys_per_server(MB8, 4_096_000, 4) == 4.0
    assert keys_per_server([8_000_000], 65_536, 4) == 8_000_000 / (4 * 65_536)


def test_keys_per_server_of_nothing_is_infinite():
    assert math.isinf(keys_per_server([], 1024, 4))


def test_warns_for_16_keys_of_500kb_over_4_servers_when_the_default_gives_more():
    msg = few_keys_warning([8_000_000], 500_000, 4, default_bytes=65_536, source="BYTEPS_PARTITION_BYTES")
    assert msg is not None
    assert "BYTEPS_PARTITION_BYTES=500000" in msg and "4.0 keys per server" in msg and "16 keys" in msg
    assert "65536" in msg


def test_no_warning_at_the_default_key_size():
    assert few_keys_warning(MB8, default_partition_bytes(4), 4, default_partition_bytes(4)) is None


def test_no_warning_when_the_default_would_not_give_more_keys():
    # every tensor is smaller than either key size: the key size changes nothing
    assert few_keys_warning(MB8, 1_000_000, 4, default_bytes=4_096_000) is None


def test_no_warning_with_enough_keys_per_server():
    sizes = [4_000_000] * (4 * MIN_KEYS_PER_SERVER)
    assert few_keys_warning(sizes, 4_000_000, 4, default_bytes=1_000_000) is None


def test_engine_warns_once_from_its_gradients(caplog):
    import threading
    from types import SimpleNamespace as NS

    from pushpull.config import Config
    from pushpull.worker.engine import Engine

    # keys set to 16 MB by hand for 64 MB of gradients over 4 servers: one key per server
    cfg = Config.defaults().replace(partition_bytes=16_000_000)
    cfg.sources["partition_bytes"] = "BYTEPS_PARTITION_BYTES"
    eng = NS(cfg=cfg, num_servers=4, rank=0,
             table=NS(lock=threading.Lock(),
                      entries={f"Gradient.w{i}": NS(parts=[NS(nbytes=16_000_000)]) for i in range(4)}
                      | {"Parameter.w": NS(parts=[NS(nbytes=1 << 30)])}))
    with caplog.at_level("WARNING"):
        first = Engine.check_keys(eng)
        assert Engine.check_keys(eng) is None
    assert "1.0 keys per server" in first and "4096000" in first
    assert sum("keys per server" in r.getMessage() for r in caplog.records) == 1


def _fitted(grad_bytes, env=None, servers=2, local=False):
    """Engine.fit_default_keys on an engine without sockets: the key size after it, and what it returned."""
    from types import SimpleNamespace

    from pushpull.config import load_config
    from pushpull.worker.engine import Engine

    eng = Engine.__new__(Engine)
    eng.cfg = load_config(env or {"DMLC_NUM_SERVER": str(servers)})
    eng.num_servers, eng.servers_local, eng.started = servers, local, False
    eng.kv = SimpleNamespace(rank=0)
    got = eng.fit_default_keys(grad_bytes)
    return eng.cfg.partition_bytes, got


@pytest.mark.parametrize("grad_bytes, servers, key", [
    (64_000_000, 2, 2_000_000),       # 16 keys per server where the 4 MB default gives 8
    (8_000_000, 2, 1 << 20),          # never below 1 MiB (the data lanes' threshold)
    (1_000_000_000, 2, 4_096_000),    # a large model keeps BytePS's key
], ids=["64MB-k2", "8MB-k2-floor", "1GB-k2-unchanged"])
def test_the_default_key_fits_the_model(grad_bytes, servers, key):
    assert _fitted(grad_bytes, servers=servers)[0] == key


def test_a_hand_set_key_is_never_refitted():
    env = {"DMLC_NUM_SERVER": "2", "BYTEPS_PARTITION_BYTES": "4096000"}
    assert _fitted(64_000_000, env=env) == (4_096_000, None)


def test_servers_on_this_host_keep_the_default_key():
    assert _fitted(64_000_000, local=True) == (4_096_000, None)
