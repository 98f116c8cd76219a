"""``pushpull bench grid`` / ``pushpull bench report`` without running a cell: the grid's jobs and the
report's bounds from hand-made rows. The smoke cells on the emulated cluster: tests/cluster/test_bench_grid.py.
"""
import pytest


def test_report_bounds_per_placement():
    """c + bytes per link / B: M/B for a PS on its own hosts (n/k M/B with fewer servers), 2(n-1)/n M/B for
    the ring and a colocated PS with k = n."""
    from pushpull.bench.report import bounds

    cell = {"compute_s": 0.16, "grad_bytes": 8e6, "bandwidth_bytes_s": 12.5e6, "workers": 4, "servers": 4}
    sep = bounds(dict(cell, placement="separate"))
    assert sep["ps_bound_s"] == pytest.approx(0.16 + 0.64) and sep["ring_bound_s"] == pytest.approx(0.16 + 0.96)
    assert bounds(dict(cell, placement="colocated"))["ps_bound_s"] == pytest.approx(0.16 + 0.96)
    assert bounds(dict(cell, placement="separate", servers=2))["ps_bound_s"] == pytest.approx(0.16 + 1.28)
    assert bounds(dict(cell, placement="colocated", servers=2))["ps_bound_s"] is None
    assert bounds(dict(cell, compute_s=None)) == {"ps_bound_s": None, "ring_bound_s": None}


def test_grid_expands_processes_per_host_and_older_rows_keep_their_cells():
    from pushpull.bench.grid_spec import cell_key, expand

    jobs = expand({"name": "x", "models": ["vgg16"], "strategies": ["wfbp"], "workers": [2], "local_size": [2],
                   "local_reduce": ["on", False], "grad_mb": 0.5})
    assert [(j["local_size"], j["local_reduce"]) for j in jobs] == [(2, "on"), (2, "off")]
    assert cell_key(dict(jobs[0], strategy="wfbp")) != cell_key(dict(jobs[1], strategy="wfbp"))
    # a row written before these fields ran one process per host with the default setting: same cell
    old = expand({"name": "x", "models": ["vgg16"], "strategies": ["wfbp"], "workers": [2], "grad_mb": 0.5})[0]
    row = {k: v for k, v in dict(old, strategy="wfbp").items() if k not in ("local_size", "local_reduce")}
    assert cell_key(row) == cell_key(dict(old, strategy="wfbp"))
    with pytest.raises(ValueError, match="local_reduce"):
        expand({"name": "x", "models": ["vgg16"], "local_reduce": ["sometimes"]})


def test_grid_ps_partition_bytes_list_is_an_axis_with_the_default_in_it():
    """A list of PS key sizes makes one job per size; "default" in it is the scaled default (what a
    user's key size is for the scaled model), and each size is its own cell."""
    from pushpull.bench.grid_spec import cell_key, expand, scaled_ps_partition_bytes

    jobs = expand({"name": "x", "models": ["vgg16"], "strategies": ["bsp"], "workers": [2], "grad_mb": 8,
                   "ps_partition_bytes": ["default", 32768, "16KiB"]})
    default = scaled_ps_partition_bytes(jobs[0]["size_scale"])
    assert [j["ps_partition_bytes"] for j in jobs] == [default, 32768, 16384]
    assert len({cell_key(dict(j, strategy="bsp")) for j in jobs}) == 3


def test_report_compares_the_local_reduce_with_flat_against_the_bound():
    from pushpull.bench.report import markdown

    base = {"model": "vgg16", "backend": "ps", "workers": 2, "servers": 2, "placement": "colocated",
            "bandwidth": "100mbit", "bandwidth_bytes_s": 12.5e6, "ratio": 0.25, "local_size": 2, "strategy": "wfbp",
            "compute_s": 0.16, "grad_bytes": 8e6, "t_comm_s": 1.0, "try_throughput": [1.0], "throughput": 1.0,
            "mode": "namespaces", "grad_mb": 8, "steps": 3, "try_step_s": [1.0]}
    rows = [dict(base, local_reduce="on", step_s=0.9, local_reduce_active=True,
                 link_bytes=[{"tx": 8e6, "rx": 8e6}, {"tx": 8e6, "rx": 8e6}]),
            dict(base, local_reduce="off", step_s=1.6, local_reduce_active=False,
                 link_bytes=[{"tx": 16e6, "rx": 16e6}, {"tx": 16e6, "rx": 16e6}])]
    md = markdown(rows, "x", [])
    line = next(ln for ln in md.splitlines() if ln.startswith("| vgg16 | wfbp | 2 x 2 |"))
    # 1.6 / 0.9 faster; bound c + M/B = 0.16 + 0.64 s (flat: c + 2 M/B); half the bytes; in force on / off
    assert "| 1600 | 900 | 1.78x | 800 | 1.12x | 1440 |" in line, line
    assert "| 0.50, 0.50 | yes / no |" in line, line


def test_report_keeps_ps_key_sizes_apart_and_compares_each_with_the_ring():
    from pushpull.bench.report import markdown

    base = {"model": "vgg16", "workers": 8, "servers": 8, "placement": "separate", "bandwidth": "100mbit",
            "bandwidth_bytes_s": 12.5e6, "ratio": 0.25, "strategy": "bsp", "compute_s": 0.16, "grad_bytes": 8e6,
            "t_comm_s": 1.0, "try_throughput": [1.0], "throughput": 1.0, "mode": "namespaces", "grad_mb": 8,
            "steps": 3, "try_step_s": [1.0]}
    rows = [dict(base, backend="ps", ps_partition_bytes=65536, step_s=0.95),
            dict(base, backend="ps", ps_partition_bytes=32768, step_s=0.90),
            dict(base, backend="allreduce", ps_partition_bytes=65536, step_s=1.35)]
    text = markdown(rows, "x", [])
    assert "| bsp (64 KiB keys) | 950 |" in text and "| bsp (32 KiB keys) | 900 |" in text
    assert "| 1.42x |" in text and "| 1.50x |" in text  # each key size against the same ring cell


def test_restrict_keeps_only_the_named_backend_and_models():
    """`pushpull bench grid --backends allreduce --models bert_large` re-runs one backend's cells of a
    config (after that backend changed); the rows keep the config's name, so they replace the old ones."""
    from pushpull.bench.grid_spec import expand, restrict

    cfg = {"name": "g", "models": ["resnet50", "bert_large"], "strategies": ["bsp", "wfbp"],
           "backends": ["ps", "allreduce"], "workers": [4], "bandwidths": ["200mbit"]}
    jobs = expand(restrict(cfg, backends="allreduce", models="bert_large"))
    assert {(j["backend"], j["model"]) for j in jobs} == {("allreduce", "bert_large")}


def test_restrict_names_a_backend_the_config_lacks():
    from pushpull.bench.grid_spec import restrict

    with pytest.raises(ValueError, match="ring"):
        restrict({"name": "g", "backends": ["ps", "allreduce"]}, backends="ring")


def test_report_pairs_a_rerun_backend_with_older_rows_of_the_other():
    """A PS row written before local_size/local_reduce existed and an all-reduce row re-run since (which
    carries them at their defaults) are the same cell: the PS-vs-all-reduce table pairs them."""
    from pushpull.bench.report import markdown

    cell = {"model": "vgg16", "workers": 4, "servers": 4, "placement": "separate", "bandwidth": "100mbit",
            "bandwidth_bytes_s": 12.5e6, "ratio": 0.25, "strategy": "wfbp", "base_strategy": "wfbp",
            "compute_s": 0.16, "grad_bytes": 8e6, "batch_size": 32, "mode": "namespaces", "config": "x",
            "try_throughput": [1.0], "throughput": 1.0, "size_scale": 1.0, "tensors": 32, "t_comm_s": 0.7}
    ps = dict(cell, backend="ps", step_s=0.8)
    ring = dict(cell, backend="allreduce", step_s=1.1, local_size=1, local_reduce="auto")
    assert "PS against all-reduce" in markdown([ps, ring], "x", [])


def test_report_labels_no_key_size_where_only_the_models_differ():
    """Each model's default key size differs with its scale; that is no axis, so no label."""
    from pushpull.bench.report import markdown

    base = {"backend": "ps", "workers": 4, "servers": 4, "placement": "colocated", "bandwidth": "200mbit",
            "bandwidth_bytes_s": 25e6, "ratio": 1.0, "strategy": "wfbp", "compute_s": 0.3, "grad_bytes": 8e6,
            "t_comm_s": 1.0, "try_throughput": [1.0], "throughput": 1.0, "mode": "namespaces", "grad_mb": 8,
            "steps": 3, "try_step_s": [1.0], "step_s": 0.7}
    text = markdown([dict(base, model="vgg16", ps_partition_bytes=65536),
                     dict(base, model="resnet50", ps_partition_bytes=320538)], "x", [])
    assert "KiB keys" not in text


def test_grid_default_key_size_follows_the_runtime_default_at_eight_servers():
    from pushpull.bench.grid_spec import scaled_ps_partition_bytes
    assert scaled_ps_partition_bytes(0.01446, 4) == 65536   # BytePS's 4,096,000 x scale, floored at 64 KiB
    assert scaled_ps_partition_bytes(0.01446, 8) == 32768   # x 4/k beyond 4 servers, as the runtime's default


def test_report_header_names_every_tries_shape_when_rows_of_two_runs_mix():
    """A page whose cells were partly re-measured with more tries says so, instead of the first row's shape."""
    from pushpull.bench.report import markdown

    base = {"model": "vgg16", "workers": 4, "servers": 4, "placement": "colocated", "bandwidth": "200mbit",
            "bandwidth_bytes_s": 25e6, "ratio": 0.25, "strategy": "wfbp", "backend": "ps", "compute_s": 0.08,
            "grad_bytes": 8e6, "t_comm_s": 0.5, "throughput": 1.0, "mode": "namespaces", "grad_mb": 8, "step_s": 0.5}
    rows = [dict(base, steps=6, try_step_s=[0.5, 0.5], try_throughput=[1.0, 1.0]),
            dict(base, ratio=0.5, steps=15, try_step_s=[0.5] * 5, try_throughput=[1.0] * 5)]
    assert "2 tries of 3 steps or 5 tries of 3 steps per cell" in markdown(rows, "x", [])
