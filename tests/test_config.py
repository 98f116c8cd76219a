"""Configuration: aliases, validation messages, and docs kept in sync."""
from pathlib import Path

import pytest

from pushpull.config import SETTINGS, ConfigError, load_config, markdown_table, worker_identity

ROOT = Path(__file__).resolve().parents[1]


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
