"""Configuration: aliases, validation messages, docs kept in sync, typed attributes, and every
documented setting read by the code."""
import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

from pushpull.config import (DEFAULTS, SETTINGS, Config, ConfigError, env_source, load_config, markdown_table,
                             read_setting, worker_identity)

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_match_byteps():
    cfg = load_config({})
    assert cfg.partition_bytes == 4096000
    assert cfg.server_engine_thread == 4
    assert cfg.min_compress_bytes == 65536
    assert cfg.scheduling_credit is None  # 'auto': one partition per server (BytePS: 0); docs/api.md says why
    assert (cfg.trace_start_step, cfg.trace_end_step, cfg.trace_dir) == (10, 20, "./trace")


def test_byteps_aliases_are_accepted_and_pushpull_names_win():
    cfg = load_config({"BYTEPS_PARTITION_BYTES": "8192000", "DMLC_NUM_WORKER": "3", "DMLC_ROLE": "server",
                       "BYTEPS_SERVER_ENGINE_THREAD": "2", "BYTEPS_LOG_LEVEL": "INFO",
                       "BYTEPS_FORCE_DISTRIBUTED": "1"})
    assert cfg.partition_bytes == 8192000 and cfg.num_worker == 3 and cfg.role == "server"
    assert cfg.server_engine_thread == 2 and cfg.log_level == "info" and cfg.force_distributed is True
    assert cfg.sources["partition_bytes"] == "BYTEPS_PARTITION_BYTES"
    cfg = load_config({"BYTEPS_PARTITION_BYTES": "8192000", "PUSHPULL_PARTITION_BYTES": "2048"})
    assert cfg.partition_bytes == 2048


@pytest.mark.parametrize("var,value,accepts", [
    ("DMLC_NUM_WORKER", "two", "integer >= 1"),
    ("DMLC_NUM_WORKER", "0", "integer >= 1"),
    ("BYTEPS_PARTITION_BYTES", "-5", "integer >= 1024"),
    ("DMLC_ROLE", "boss", "worker | server | scheduler"),
    ("BYTEPS_FORCE_DISTRIBUTED", "maybe", "0 | 1"),
    ("PUSHPULL_TIMEOUT", "0", "seconds > 0"),
])
def test_bad_values_name_the_variable_and_what_it_accepts(var, value, accepts):
    with pytest.raises(ConfigError) as e:
        load_config({var: value})
    assert var in str(e.value) and repr(value) in str(e.value) and accepts in str(e.value)


def test_every_setting_has_a_pushpull_variable_and_docs():
    for s in SETTINGS:
        assert s.env.startswith("PUSHPULL_") and s.doc and s.accepts


def test_docs_configuration_is_in_sync():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == markdown_table(), "docs/configuration.md is stale: run `pushpull config --markdown > docs/configuration.md`"


def test_rank_from_byteps_torchrun_slurm_and_mpi():
    cfg = load_config({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "1", "BYTEPS_LOCAL_SIZE": "4",
                       "BYTEPS_LOCAL_RANK": "2"})
    ident = worker_identity(cfg, {})
    assert (ident.rank, ident.size, ident.local_rank, ident.local_size) == (6, 8, 2, 4)
    cfg = load_config({})
    for env, src in [({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "torchrun"),
                     ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                       "SLURM_NTASKS_PER_NODE": "2"}, "slurm"),
                     ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                       "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "openmpi")]:
        ident = worker_identity(cfg, env)
        assert (ident.rank, ident.size, ident.local_rank, ident.local_size, ident.source) == (3, 4, 1, 2, src)
    with pytest.raises(ConfigError, match="DMLC_WORKER_ID"):
        worker_identity(load_config({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "2"}), {})


def test_config_has_one_typed_attribute_per_setting_holding_its_default_type():
    hints = typing.get_type_hints(Config)
    assert [f.name for f in dataclasses.fields(Config) if f.name != "sources"] == [s.name for s in SETTINGS]
    for s in SETTINGS:
        hint = hints[s.name]
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        assert type(s.default) in allowed, f"{s.env}: default {s.default!r} is not a {hint}"


def test_a_misspelt_setting_is_an_attribute_error_and_settings_cannot_be_assigned():
    cfg = load_config({})
    with pytest.raises(AttributeError, match="partiton_bytes"):
        cfg.partiton_bytes  # noqa: B018 - the typo is the point
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.partition_bytes = 1


def test_replace_changes_the_named_setting_keeps_the_sources_and_refuses_unknown_names():
    cfg = load_config({"BYTEPS_PARTITION_BYTES": "8192000"})
    new = cfg.replace(direct_bytes=0)
    assert (new.direct_bytes, cfg.direct_bytes, new.partition_bytes) == (0, 65536, 8192000)
    assert new.sources["partition_bytes"] == "BYTEPS_PARTITION_BYTES"
    with pytest.raises(ConfigError, match="partiton_bytes"):
        cfg.replace(partiton_bytes=1)


def test_defaults_ignore_the_environment(monkeypatch):
    monkeypatch.setenv("BYTEPS_PARTITION_BYTES", "8192000")
    assert DEFAULTS == Config.defaults() == load_config({})
    assert Config.defaults().partition_bytes == 4096000 and load_config().partition_bytes == 8192000


def test_env_source_prefers_the_pushpull_name_as_load_config_does():
    env = {"DMLC_ROLE": "server", "PUSHPULL_ROLE": "scheduler"}
    assert env_source("role", env) == ("PUSHPULL_ROLE", "scheduler") and load_config(env).role == "scheduler"
    assert env_source("role", {"DMLC_ROLE": "server"}) == ("DMLC_ROLE", "server")
    assert env_source("role", {}) is None


def test_the_secret_is_not_in_the_config_repr():
    assert "s3cr3t" not in repr(load_config({"PUSHPULL_SECRET": "s3cr3t"}))


def test_every_documented_setting_is_read_by_the_code():
    """A row of docs/configuration.md that nothing reads would be a setting that does nothing."""
    pkg = ROOT / "pushpull"
    text = "\n".join(p.read_text() for p in pkg.rglob("*.py") if p.name != "config.py")
    # config.py reads some itself (worker_identity, python_log_level); its table rows do not count
    text += "\n".join(line for line in (pkg / "config.py").read_text().splitlines()
                      if not re.match(r"\s+S\(", line))
    unread = [s.env for s in SETTINGS
              if not re.search(rf"\.{s.name}\b|[\"']{s.name}[\"']|\b{s.env}\b", text)]
    assert not unread, f"documented settings nothing reads: {unread}"


def test_pushpull_role_starts_the_role_as_dmlc_role_does(capsys, monkeypatch):
    from pushpull.launch import cli, torchrun

    monkeypatch.delenv("DMLC_ROLE", raising=False)
    monkeypatch.setenv("PUSHPULL_ROLE", "boss")
    assert cli.main(["--", "true"]) == 2  # not a local job of `true`: the role is read, and refused
    assert "PUSHPULL_ROLE='boss' is invalid; PUSHPULL_ROLE accepts worker | server | scheduler" \
        in capsys.readouterr().err
    assert not torchrun.wanted({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2",
                                "PUSHPULL_ROLE": "worker"})


def test_read_setting_default_names_its_source():
    assert read_setting("servers_per_node", {}) == (1, "default")


def test_servers_per_node_read_from_the_table():
    assert read_setting("servers_per_node", {"PUSHPULL_SERVERS_PER_NODE": "3"}) == (3, "PUSHPULL_SERVERS_PER_NODE")


def test_servers_per_node_bad_value_names_the_variable():
    with pytest.raises(ConfigError, match=r"PUSHPULL_SERVERS_PER_NODE='two' is invalid.*accepts integer >= 0"):
        read_setting("servers_per_node", {"PUSHPULL_SERVERS_PER_NODE": "two"})


def test_default_key_size_is_bytepss_up_to_four_servers():
    from pushpull.config import default_partition_bytes
    assert [default_partition_bytes(k) for k in (1, 2, 4)] == [4096000] * 3


def test_default_key_size_shrinks_as_one_over_k_beyond_four_servers():
    from pushpull.config import default_partition_bytes
    assert default_partition_bytes(8) == 2048000
    assert default_partition_bytes(16) == 1024000
    assert default_partition_bytes(10**6) == 65536   # floored


def test_load_config_applies_the_server_count_to_the_default_key_size():
    cfg = load_config({"DMLC_NUM_SERVER": "8"})
    assert (cfg.partition_bytes, cfg.sources["partition_bytes"]) == (2048000, "default")


def test_a_set_key_size_wins_over_the_server_count():
    cfg = load_config({"DMLC_NUM_SERVER": "8", "BYTEPS_PARTITION_BYTES": "4096000"})
    assert (cfg.partition_bytes, cfg.sources["partition_bytes"]) == (4096000, "BYTEPS_PARTITION_BYTES")


def test_partition_bytes_larger_than_a_message_is_capped_with_one_warning(caplog):
    """BytePS's own tests set BYTEPS_PARTITION_BYTES=2147483647 ('do not partition'): a maximum, so a
    worker caps it at what a message carries and says so once; scheduler and servers do not look at it."""
    env = {"BYTEPS_PARTITION_BYTES": "2147483647", "PUSHPULL_MAX_MESSAGE_BYTES": str(8 << 20)}
    with caplog.at_level("WARNING", logger="pushpull"):
        first, second = load_config(env), load_config(env)
    assert first.partition_bytes == second.partition_bytes == (8 << 20) // 2 - 65536
    warned = [r.getMessage() for r in caplog.records if "BYTEPS_PARTITION_BYTES=2147483647" in r.getMessage()]
    assert len(warned) == 1 and "PUSHPULL_MAX_MESSAGE_BYTES=8388608" in warned[0], warned
    for role in ("scheduler", "server"):
        cfg = load_config({**env, "DMLC_ROLE": role, "BYTEPS_PARTITION_BYTES": str(4 << 20)})
        assert cfg.partition_bytes == 4 << 20


def test_consistency_errors_name_the_variable_not_default():
    """A setting left at its default is named by its variable (the message used to say 'default=10')."""
    with pytest.raises(ConfigError, match="PUSHPULL_TRACE_END_STEP=1 is before PUSHPULL_TRACE_START_STEP=10"):
        load_config({"PUSHPULL_TRACE_END_STEP": "1"})
