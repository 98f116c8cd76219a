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
