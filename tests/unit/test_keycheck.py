"""The warning for a hand-set key size with too few keys per server (pushpull.worker.keycheck)."""
from __future__ import annotations

import math

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
    eng = NS(cfg=cfg, num_servers=4, rank=0, table_lock=threading.Lock(),
             entries={f"Gradient.w{i}": NS(parts=[NS(nbytes=16_000_000)]) for i in range(4)}
             | {"Parameter.w": NS(parts=[NS(nbytes=1 << 30)])})
    with caplog.at_level("WARNING"):
        first = Engine.check_keys(eng)
        assert Engine.check_keys(eng) is None
    assert "1.0 keys per server" in first and "4096000" in first
    assert sum("keys per server" in r.getMessage() for r in caplog.records) == 1
