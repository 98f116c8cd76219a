"""elastic.run's commit on a node's disk (PUSHPULL_ELASTIC_DIR), for torchrun --nnodes MIN:MAX, which restarts
every worker on a change: where it goes, that it round-trips a model and an optimizer, and what it refuses."""
from __future__ import annotations

import os

import pytest
import torch

from pushpull.torch.elastic import Keeper, State, TorchState

TORCHRUN = {"TORCHELASTIC_RUN_ID": "job/1", "TORCHELASTIC_MAX_RESTARTS": "3"}


def _trained_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    return TorchState(model, opt, epoch=0, sizes=[])


def test_no_folder_outside_torchrun_unless_asked():
    assert Keeper.from_env({}, writer=True) is None


def test_no_folder_under_torchrun_without_restarts():
    assert Keeper.from_env({"TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_MAX_RESTARTS": "0"}, writer=True) is None


def test_off_turns_it_off_under_torchrun():
    assert Keeper.from_env({**TORCHRUN, "PUSHPULL_ELASTIC_DIR": "off"}, writer=True) is None


def test_under_torchrun_a_private_folder_per_run_in_the_temp_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    keeper = Keeper.from_env(TORCHRUN, writer=True)
    assert keeper.folder == tmp_path / f"pushpull-elastic-{os.getuid()}-job_1"
    assert keeper.folder.stat().st_mode & 0o777 == 0o700


def test_a_default_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"pushpull-elastic-{os.getuid()}-job_1"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(RuntimeError, match="not this user's private folder"):
        Keeper.from_env(TORCHRUN, writer=True)


def test_a_commit_kept_on_disk_gives_a_fresh_process_the_model_the_optimizer_and_the_values(tmp_path):
    state = _trained_state()
    object.__setattr__(state, "_keeper", Keeper(tmp_path, writer=True))
    state.epoch, state.sizes = 7, [2, 2, 1]
    state.commit()
    want = state.model.weight.detach().clone()
    state.model.weight.data.add_(5.0)  # after the commit: not kept
    kept = Keeper(tmp_path, writer=True).load()
    assert kept["commits"] == 1
    fresh = TorchState(torch.nn.Linear(4, 2), None, epoch=0, sizes=[])
    opt = torch.optim.SGD(fresh.model.parameters(), lr=0.1, momentum=0.9)
    object.__setattr__(fresh, "optimizer", opt)
    fresh.take(kept)
    assert fresh.epoch == 7 and fresh.sizes == [2, 2, 1]
    assert torch.equal(fresh.model.weight, want)
    buf = opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(buf, state.optimizer.state_dict()["state"][0]["momentum_buffer"])
    fresh.model.weight.data.zero_()
    fresh.restore()  # what it took is also its last commit
    assert torch.equal(fresh.model.weight, want)


def test_only_the_nodes_writer_keeps_and_reads_it(tmp_path):
    state = State(epoch=1)
    object.__setattr__(state, "_keeper", Keeper(tmp_path, writer=False))
    state.commit()
    assert not (tmp_path / Keeper.FILE).exists() and Keeper(tmp_path, writer=False).load() is None


def test_each_commit_replaces_the_last_and_counts(tmp_path):
    state = State(epoch=0)
    object.__setattr__(state, "_keeper", Keeper(tmp_path, writer=True))
    for epoch in range(3):
        state.epoch = epoch
        state.commit()
    kept = Keeper(tmp_path, writer=True).load()
    assert kept["commits"] == 3 and kept["values"] == {"epoch": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [Keeper.FILE]


def test_a_file_that_holds_code_is_set_aside_not_run(tmp_path):
    """weights_only refuses it; the file is set aside, so that no restart reads it again, and nothing resumes."""
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    torch.save({"commits": 1, "values": {"x": Evil()}}, tmp_path / Keeper.FILE)
    assert Keeper(tmp_path, writer=True).load() is None
    assert not (tmp_path / "ran").exists() and (tmp_path / (Keeper.FILE + ".unreadable")).exists()
    assert not (tmp_path / Keeper.FILE).exists()


def test_an_earlier_runs_commit_under_the_same_run_id_is_not_resumed(tmp_path):
    """In the default folder a commit belongs to the torchrun agent that wrote it (which lives through every
    round of one run): a new run's agent starts afresh."""
    state = State(epoch=3)
    object.__setattr__(state, "_keeper", Keeper(tmp_path, writer=True, owner="100:555"))
    state.commit()
    assert Keeper(tmp_path, writer=True, owner="100:555").load()["values"] == {"epoch": 3}
    assert Keeper(tmp_path, writer=True, owner="101:777").load() is None


def test_a_value_added_after_the_start_does_not_change_the_fingerprint():
    state = State(epoch=0)
    before = state._fingerprint()
    state.best = 1.0
    assert state._fingerprint() == before


def test_no_default_folder_for_torchruns_default_run_id_none():
    """Every job started without --rdzv-id is 'none': a folder for it would hand one job another's commit."""
    assert Keeper.from_env({"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_MAX_RESTARTS": "3"}, writer=True) is None


def test_another_jobs_commit_is_not_resumed(tmp_path):
    state = _trained_state()
    object.__setattr__(state, "_keeper", Keeper(tmp_path, writer=True))
    state.commit()
    other = TorchState(torch.nn.Linear(4, 3), None, epoch=0, sizes=[])  # another model
    assert Keeper(tmp_path, writer=True).load(other._fingerprint()) is None
    assert Keeper(tmp_path, writer=True).load(state._fingerprint())["commits"] == 1


def test_a_part_written_file_of_a_killed_worker_is_removed(tmp_path):
    (tmp_path / f".{Keeper.FILE}.12345").write_bytes(b"half")
    Keeper.from_env({"PUSHPULL_ELASTIC_DIR": str(tmp_path)}, writer=True)
    assert list(tmp_path.iterdir()) == []


def test_the_kept_file_is_readable_by_its_user_only(tmp_path):
    state = State(epoch=0)
    object.__setattr__(state, "_keeper", Keeper(tmp_path, writer=True))
    state.commit()
    assert (tmp_path / Keeper.FILE).stat().st_mode & 0o777 == 0o600
