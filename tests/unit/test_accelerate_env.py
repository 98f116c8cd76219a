"""pushpull.accelerate.accelerate_as_one_process: the launchers' rank variables are hidden while Accelerate's
state is built, and all of them come back, also when building it fails."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("accelerate", reason="the [accelerate] extra is not installed")
from pushpull.accelerate import accelerate_as_one_process  # noqa: E402

LAUNCHED = {"LOCAL_RANK": "1", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_SIZE": "4", "PMI_RANK": "3", "MV2_COMM_WORLD_SIZE": "4"}


@pytest.fixture
def launched(monkeypatch):
    for k, v in LAUNCHED.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")


def test_the_rank_variables_are_hidden_inside(launched):
    with accelerate_as_one_process():
        assert not set(LAUNCHED) & set(os.environ)


def test_other_variables_stay(launched):
    with accelerate_as_one_process():
        assert os.environ["MASTER_ADDR"] == "127.0.0.1"


def test_every_variable_comes_back_after(launched):
    with accelerate_as_one_process():
        pass
    assert {k: os.environ[k] for k in LAUNCHED} == LAUNCHED


def test_every_variable_comes_back_after_an_error(launched):
    with pytest.raises(RuntimeError):
        with accelerate_as_one_process():
            raise RuntimeError("building the state failed")
    assert {k: os.environ[k] for k in LAUNCHED} == LAUNCHED


def test_accelerate_built_inside_is_a_job_of_one_process(launched):
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    PartialState._reset_state()
    try:
        with accelerate_as_one_process():
            state = PartialState(cpu=True)
        assert (state.distributed_type, state.num_processes) == (DistributedType.NO, 1)
    finally:
        PartialState._reset_state()
