"""PUSHPULL_DATA_LANE=auto (pushpull.config.data_lane_on): lanes carry a job's pushes and pulls when its keys
are large (where a lane's per-byte savings outweigh handling each message in Python), never when lanes are off
(PUSHPULL_DIRECT_LANE=0) or 0, always with 1."""
import pytest

from pushpull.config import LANE_MIN_PARTITION_BYTES, data_lane_on, load_config


def cfg(**env):
    return load_config({k: str(v) for k, v in env.items()})


def test_auto_is_the_default_and_takes_lanes_with_the_default_keys():
    c = cfg()
    assert c.data_lane == "auto"
    assert c.partition_bytes >= LANE_MIN_PARTITION_BYTES
    assert data_lane_on(c)


def test_auto_keeps_small_keys_on_zeromq():
    assert not data_lane_on(cfg(BYTEPS_PARTITION_BYTES=65536))
    assert data_lane_on(cfg(BYTEPS_PARTITION_BYTES=LANE_MIN_PARTITION_BYTES))


@pytest.mark.parametrize("value,want", [("1", True), ("on", True), ("0", False), ("off", False)])
def test_explicit_setting_wins_over_the_key_size(value, want):
    assert data_lane_on(cfg(PUSHPULL_DATA_LANE=value, BYTEPS_PARTITION_BYTES=65536)) is want
    assert data_lane_on(cfg(PUSHPULL_DATA_LANE=value)) is want


def test_no_lanes_without_direct_lanes():
    assert not data_lane_on(cfg(PUSHPULL_DIRECT_LANE=0, PUSHPULL_DATA_LANE=1))


def test_a_bad_value_names_the_choices():
    with pytest.raises(Exception, match="auto"):
        cfg(PUSHPULL_DATA_LANE="sometimes")
