"""The pure parts of ``pushpull bench wire``: CPU-per-GB arithmetic, the bytes each role moves, the cells
built from --auth/--variant/--env, the ratios and the table. The end-to-end run is
tests/cluster/test_bench_wire.py."""
import math

import pytest

from pushpull.bench import wire

MiB = 1 << 20


def test_cpu_per_gb_is_seconds_per_1e9_bytes():
    assert wire.cpu_per_gb(1.5, 3e9) == pytest.approx(0.5)


def test_cpu_per_gb_refuses_no_bytes():
    with pytest.raises(ValueError):
        wire.cpu_per_gb(1.0, 0)


def test_proc_stat_reads_utime_plus_stime_past_a_name_with_spaces():
    line = "4242 (python -m x) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 3 0 100 0 0"
    assert wire.parse_proc_stat(line, 100) == pytest.approx(3.0)


def test_raw_payload_is_bytes_sent_and_socket_bytes_both_ways():
    assert wire.payload_bytes("raw", "proc0", 4 * MiB, 10) == (40 * MiB, 80 * MiB)


def test_gloo_socket_bytes_are_the_ring_traffic():
    pay, sock = wire.payload_bytes("gloo", "rank0", 1000, 3, workers=4)
    assert (pay, sock) == (3000, pytest.approx(2 * 2 * 3 / 4 * 3000))


def test_worker_moves_its_tensor_each_way():
    assert wire.payload_bytes("push_pull", "worker1", 1000, 2, workers=2, servers=1) == (2000, 4000)


def test_server_payload_is_the_jobs_gradient_and_socket_bytes_scale_with_workers_over_servers():
    pay, sock = wire.payload_bytes("push_pull", "server1", 1000, 2, workers=4, servers=2)
    assert (pay, sock) == (2000, 8000)


def test_steps_cover_the_payload_and_are_at_least_two():
    assert wire.steps_for(1.0, 64 * MiB) == math.ceil(1e9 / (64 * MiB))
    assert wire.steps_for(0.001, 64 * MiB) == 2


def test_env_pair_keeps_an_empty_value():
    assert wire.parse_env_pair("PUSHPULL_DATA_LANE=") == ("PUSHPULL_DATA_LANE", "")


def test_env_pair_refuses_a_missing_name():
    with pytest.raises(ValueError):
        wire.parse_env_pair("=1")


def test_variant_parses_label_and_variables():
    assert wire.parse_variant("lane:PUSHPULL_DATA_LANE=1,X=a=b") == ("lane", {"PUSHPULL_DATA_LANE": "1", "X": "a=b"})


def test_variant_refuses_a_missing_label():
    with pytest.raises(ValueError):
        wire.parse_variant("PUSHPULL_DATA_LANE=1")


def test_auth_refuses_an_unknown_mode():
    with pytest.raises(ValueError):
        wire.parse_auth("none,tls")


def test_cells_cross_auth_with_baseline_and_variants():
    cells = wire.make_cells(["none", "curve"], [("lane", {"PUSHPULL_DATA_LANE": "1"})], {})
    assert [c.label for c in cells] == ["none", "none+lane", "curve", "curve+lane"]


def test_cell_variables_force_tcp_then_auth_then_env_then_variant():
    (c,) = wire.make_cells(["plain"], [("v", {"PUSHPULL_LOCAL_IPC": "1"})], {"PUSHPULL_LOCAL_SHM": "1", "A": "x"},
                           baseline=False)
    assert c.env == {"PUSHPULL_LOCAL_SHM": "1", "PUSHPULL_LOCAL_IPC": "1", "PUSHPULL_AUTH": "plain", "A": "x"}


def test_variant_setting_auth_is_labelled_by_it_and_duplicates_dropped():
    cells = wire.make_cells(["none", "plain"], [("c", {"PUSHPULL_AUTH": "curve"})], {}, baseline=False)
    assert [c.label for c in cells] == ["curve+c"]


def _rows():
    return [wire.make_row("memcpy", "-", "-", "1 thread", 0.1, 0.1, 1e9, None),
            wire.make_row("raw", "veth", "-", "proc0", 0.5, 1.0, 1e9, 2e9),
            wire.make_row("raw", "veth", "-", "proc1", 0.7, 1.0, 1e9, 2e9),
            wire.make_row("gloo", "veth", "-", "rank0", 1.0, 1.0, 1e9, 2e9),
            wire.make_row("gloo", "veth", "-", "rank1", 1.0, 1.0, 1e9, 2e9),
            wire.make_row("push_pull", "veth", "none", "worker0", 1.2, 2.0, 1e9, 2e9),
            wire.make_row("push_pull", "veth", "none", "server0", 3.0, 2.0, 1e9, 4e9)]


def test_ratios_divide_by_the_mean_gloo_rank_and_raw_process():
    rows = wire.add_ratios(_rows())
    w = rows[5]
    assert (w["x_gloo"], w["x_gloo_socket"], w["x_raw"]) == (pytest.approx(1.2), pytest.approx(1.2),
                                                             pytest.approx(0.6 / 0.3))


def test_primitives_get_no_ratio():
    assert wire.add_ratios(_rows())[0]["x_gloo"] is None


def test_table_has_a_header_and_one_line_per_row():
    rows = wire.add_ratios(_rows())
    lines = wire.format_table(rows).splitlines()
    assert len(lines) == 2 + len(rows) and "x raw" in lines[0] and "| server0" in lines[-1]


def test_goal_line_names_the_worst_role_and_the_verdict():
    (line,) = wire.goal_lines(wire.add_ratios(_rows()))
    assert "servers x gloo 3.00 (per socket byte 1.50), x raw 2.50" in line and "misses" in line


def test_expected_rows_per_transport():
    assert wire.expected_rows(cells=4, workers=2, servers=1) == 2 + 2 + 4 * 3


def test_parser_defaults_run_every_auth_mode_on_both_transports():
    a = wire.build_parser().parse_args([])
    assert (a.auth, a.transports, a.gb, a.rate) == ("none,plain,curve,auto", "loopback,veth", 1.0, None)
