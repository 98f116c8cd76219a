"""One meaning per unit (pushpull.units), whichever part reads it: the emulator and the simulator agree."""
from __future__ import annotations

import pytest

from pushpull import units
from pushpull.emulate.netns import parse_rate, parse_time
from pushpull.sim.config import parse_bandwidth, parse_duration


@pytest.mark.parametrize("text,bytes_per_s", [
    ("100mbit", 12.5e6), ("100mbps", 12.5e6), ("100Mbps", 12.5e6), ("1gbit", 125e6), ("25Gbps", 25e9 / 8),
    ("800kbit", 100e3), ("12.5MB/s", 12.5e6), ("1.25GB/s", 1.25e9), ("100B/s", 100.0),
])
def test_a_rate_means_the_same_to_emulator_and_simulator(text, bytes_per_s):
    assert units.rate_bytes(text) == pytest.approx(bytes_per_s)
    assert parse_bandwidth(text) == pytest.approx(bytes_per_s)
    assert parse_rate(text) == pytest.approx(bytes_per_s * 8)  # tc is given bits


@pytest.mark.parametrize("text", ["100", "1e9", "10GB", "fast"])
def test_an_ambiguous_rate_is_refused_everywhere(text):
    for parse in (units.rate_bytes, parse_bandwidth, parse_rate):
        with pytest.raises(ValueError):
            parse(text)


def test_a_rate_from_code_is_bytes_per_second():
    assert parse_bandwidth(1.25e9) == 1.25e9 and parse_rate(1.25e9) == 1e10


@pytest.mark.parametrize("text,seconds", [("5ms", 5e-3), ("500us", 500e-6), ("500µs", 500e-6), ("0.2s", 0.2),
                                          ("10ns", 10e-9)])
def test_a_duration_means_the_same_to_emulator_and_simulator(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds) and parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["3", "0.2", "soon"])
def test_a_duration_without_unit_is_refused_everywhere(text):
    for parse in (parse_duration, parse_time):
        with pytest.raises(ValueError, match="unit|parse"):
            parse(text)


@pytest.mark.parametrize("text,n", [("4096000", 4_096_000), ("4MB", 4_000_000), ("4m", 4_000_000),
                                    ("64MiB", 64 << 20), ("1kib", 1024)])
def test_sizes(text, n):
    assert units.size_bytes(text) == n


def test_mbit_and_mbps_are_both_megabits():
    assert units.rate_bytes("8mbit") == units.rate_bytes("8mbps") == 1e6


def test_megabytes_per_second_is_written_with_a_slash():
    assert units.rate_bytes("1MB/s") == 1e6 and units.rate_bytes("1MB/s") == 8 * units.rate_bytes("1mbit")


def test_a_bare_number_is_a_size_in_bytes():
    assert units.size_bytes("4096") == 4096 and units.size_bytes(4096.0) == 4096


@pytest.mark.parametrize("text", ["200mbit", "200mbps", "25MB/s"])
def test_the_grid_gives_the_emulator_and_its_compute_scale_the_same_rate(text):
    from pushpull.bench.grid_spec import expand
    job = expand({"strategies": ["wfbp"], "bandwidths": [text], "workers": [2]})[0]
    assert job["bandwidth_bytes_s"] * 8 == pytest.approx(parse_rate(job["bandwidth"]))


def test_the_grid_refuses_a_bandwidth_without_unit():
    from pushpull.bench.grid_spec import expand
    with pytest.raises(ValueError, match="bandwidths"):
        expand({"strategies": ["wfbp"], "bandwidths": ["200"], "workers": [2]})


def test_the_grid_reads_variant_sizes_with_units():
    from pushpull.bench.grid_spec import strategy_spec
    spec = strategy_spec("bs", {"variants": {"bs": {"base": "bytescheduler", "partition_bytes": "4MB",
                                                    "credit_bytes": 8e6}}})
    assert (spec["partition_bytes"], spec["credit_bytes"]) == (4_000_000, 8_000_000)


@pytest.mark.parametrize("value,text", [(1.25e9, "10gbit"), (12.5e6, "100mbit"), (float("inf"), "inf")])
def test_a_rate_formats_back_to_what_parses(value, text):
    assert units.format_rate(value) == text and units.rate_bytes(text, allow_inf=True) == value
