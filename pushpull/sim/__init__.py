"""pushpull.sim: a discrete-event simulator and planner for data-parallel
training over a parameter server or a ring all-reduce.

Pure Python: no sockets, no threads, no torch. See docs/simulator.md.

    from pushpull.sim import simulate, ClusterConfig
    res = simulate(profile, ClusterConfig(workers=8, servers=8, bandwidth=parse_bandwidth("10gbit")),
                   "bytescheduler")
    res.iteration_s, res.throughput, res.write_trace("sim.json")
"""
from pushpull.sim.config import (ClusterConfig, Compression, CpuCosts, SimOptions, format_bandwidth, format_bytes,
                                 parse_bandwidth, parse_bytes, parse_duration)
from pushpull.sim.events import SimResult, simulate
from pushpull.sim.executors import (BSP, MGWFBP, STRATEGIES, WFBP, ByteScheduler, Fusion, make_strategy,
                                     mgwfbp_merge)
from pushpull.sim.synthetic import synthetic_profile, transformer_like

__all__ = [
    "simulate", "SimResult", "ClusterConfig", "Compression", "CpuCosts", "SimOptions",
    "BSP", "WFBP", "Fusion", "MGWFBP", "ByteScheduler", "STRATEGIES", "make_strategy", "mgwfbp_merge",
    "parse_bandwidth", "parse_bytes", "parse_duration", "format_bandwidth", "format_bytes",
    "synthetic_profile", "transformer_like", "validate",
]


def validate(measured_rows, **kwargs):
    """Predicted vs measured step times; see :func:`pushpull.sim.validate.validate`."""
    from pushpull.sim.validate import validate as _v
    return _v(measured_rows, **kwargs)
