"""The ``auto`` strategy (PUSHPULL_STRATEGY=auto) in one process, with fake backends: the simulator's
inputs built from measurements reproduce the probes, the runner-up differs in backend or strategy, a
failed confirmation falls back to the runner-up (with an injected measurement) and a confirmed choice
is kept, gradients are reduced correctly through every switch. Jobs under the real launcher:
tests/cluster/test_strategy_auto.py. No timing is asserted.
"""
from __future__ import annotations

import pytest
import torch

from pushpull.torch.executors import auto_plan


# --------------------------------------------------------------------------- pure parts
def test_fitted_cluster_reproduces_the_probe():
    cl = auto_plan.fit_cluster("ps", 4, 4, probe_bytes=4_000_000, t_probe=0.4, t_small=2e-3, t_stream=5e-4,
                               ps_partition_bytes=65536)
    assert cl.message_s == pytest.approx(5e-4) and cl.latency == pytest.approx(0.75e-3)
    assert auto_plan._one_buffer_s(cl, 4_000_000) == pytest.approx(0.4, rel=1e-3)


def test_measured_profile_keeps_ready_times_and_sizes():
    prof = auto_plan.measured_profile(["c", "b", "a"], [0.0, 0.01, 0.03], [400, 800, 1200], forward_s=0.015)
    assert [l.name for l in prof.layers] == ["a", "b", "c"]          # forward order: last ready first
    assert [l.bwd_s for l in prof.layers] == pytest.approx([0.02, 0.01, 0.0])
    assert prof.fwd_s == pytest.approx(0.015) and prof.nbytes == 2400


def _cands(*pairs) -> list[dict]:
    return [{"backend": b, "strategy": st, "predicted_s": 1.0 + i / 100} for i, (b, st) in enumerate(pairs)]


@pytest.mark.parametrize("pairs", [
    # the other backend's best, though another PS strategy predicts faster
    [("ps", "bytescheduler"), ("ps", "fusion"), ("allreduce", "mgwfbp"), ("allreduce", "fusion")],
    # one backend only: the best of another strategy
    [("ps", "bytescheduler"), ("ps", "bytescheduler"), ("ps", "wfbp")],
    # the same strategy again is never the runner-up
    [("ps", "bytescheduler"), ("ps", "bytescheduler"), ("allreduce", "fusion")],
], ids=["other-backend", "one-backend", "same-strategy-skipped"])
def test_runner_up(pairs):
    cands = _cands(*pairs)
    best, runner = auto_plan.choose(cands)
    assert best is cands[0] and runner is cands[2]


def test_candidates_can_be_restricted_to_a_backend():
    cands = _cands(("ps", "bytescheduler"), ("allreduce", "fusion"))
    assert auto_plan.allowed(cands, ["allreduce:*"]) == [cands[1]]


# --------------------------------------------------------------------------- fake backends
@pytest.fixture(scope="module")
def single_process():
    import pushpull.torch as bps

    bps.init()  # no cluster in the environment: size 1, nothing started
    yield bps


def scripted(confirm_s: float, runner_s: float, **kw):
    """An Auto over two doubling fake backends whose probes and phase times are injected."""
    from pushpull.torch.executors.auto import Auto
    from fakes import Doubling

    class Scripted(Auto):
        def probe(self, backend, nbytes):  # PS 4x faster than the ring: PS wins
            return {"probe_bytes": nbytes, "t_probe": 0.05 if backend == "ps" else 0.2, "t_small": 1e-3,
                    "t_stream": 2e-4}

        def shape(self):
            return 4, 4, False

        def phase_time(self, phase, times):
            return {"measure": 1.0, "confirm": confirm_s, "runner_up": runner_s}[phase]

    comms = {"ps": Doubling("ps"), "allreduce": Doubling("allreduce")}
    return Scripted(comms=comms, **kw), comms


def run_steps(st, steps: int) -> None:
    for step in range(steps):
        grads = [torch.full((1000 * (i + 1),), float(i + step)) for i in range(5)]
        for i in reversed(range(5)):
            st.on_ready(f"g{i}", grads[i], -i)
        st.on_backward_done()
        st.wait_all()
        for i, g in enumerate(grads):
            assert torch.equal(g, torch.full_like(g, 2.0 * (i + step))), (step, i)


def test_failed_confirmation_falls_back_to_the_runner_up(single_process):
    st, comms = scripted(confirm_s=50.0, runner_s=0.5, candidates=["ps:wfbp", "allreduce:fusion"])
    run_steps(st, 3 + 3 + 3 + 2)   # measure, confirm (fails), runner-up (faster), final
    d = st.decision
    assert (d["choice"]["backend"], d["choice"]["strategy"]) == ("ps", "wfbp")
    assert (d["runner_up"]["backend"], d["runner_up"]["strategy"]) == ("allreduce", "fusion")
    assert d["kept"] == "runner_up" and d["measured"] == {"choice": 50.0, "runner_up": 0.5}
    assert st.phase == "final" and st.current.name == "fusion" and st.current.comm is comms["allreduce"]
    assert any("fusion[" in n for n in comms["allreduce"].sent)   # the plan from auto's measurements fused


def test_confirmed_choice_is_kept(single_process):
    st, comms = scripted(confirm_s=0.5, runner_s=0.1, candidates=["ps:wfbp", "ps:bsp"])
    run_steps(st, 3 + 3 + 2)
    d = st.decision
    assert (d["runner_up"]["backend"], d["runner_up"]["strategy"]) == ("ps", "bsp")
    assert d["kept"] == "choice" and "runner_up" not in d["measured"]
    assert st.current.comm is comms["ps"] and st.current.name == "wfbp" and not comms["allreduce"].sent


def test_other_backend_is_measured_even_when_the_choice_is_confirmed(single_process):
    st, comms = scripted(confirm_s=0.5, runner_s=0.1, candidates=["ps:wfbp", "allreduce:fusion"])
    run_steps(st, 3 + 3 + 3 + 2)   # measure, confirm (as predicted), the other backend (faster), final
    d = st.decision
    assert d["kept"] == "runner_up" and d["measured"] == {"choice": 0.5, "runner_up": 0.1}
    assert st.current.comm is comms["allreduce"] and st.current.name == "fusion"


def test_other_backend_measured_slower_keeps_the_choice(single_process):
    st, comms = scripted(confirm_s=0.5, runner_s=0.9, candidates=["ps:wfbp", "allreduce:fusion"])
    run_steps(st, 3 + 3 + 3 + 2)
    d = st.decision
    assert d["kept"] == "choice" and d["measured"] == {"choice": 0.5, "runner_up": 0.9}
    assert st.current.comm is comms["ps"] and st.current.name == "wfbp"


def test_compression_keeps_auto_on_the_parameter_servers(single_process):
    st, comms = scripted(confirm_s=0.5, runner_s=0.1, compression={"name": "fp16"})
    assert st.backends == ("ps",)
    run_steps(st, 3 + 3 + 2)
    assert st.decision["final"]["backend"] == "ps" and not comms["allreduce"].sent


def test_unknown_candidates_are_refused(single_process):
    with pytest.raises(ValueError, match="match no backend"):
        scripted(1.0, 1.0, candidates=["ps:nope"])
