"""The timeline's pieces in this process: interval algebra, summaries, the tracer's step window. Live
timelines of real jobs and the ``pushpull timeline`` command: tests/cluster/test_timeline.py."""
from __future__ import annotations

from pushpull import timeline_cli as tl
from pushpull.worker import trace


def X(tid, name, cat, ts, dur, **args):
    return {"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_interval_algebra():
    u = tl.union([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)])
    assert u == [(0, 3), (5, 8)]
    assert tl.length(u) == 6
    assert tl.intersect(u, [(2, 6)]) == [(2, 3), (5, 6)]
    assert tl.subtract(u, [(1, 2), (6, 10)]) == [(0, 1), (2, 3), (5, 6)]
    assert tl.clip(u, 1, 6) == [(1, 3), (5, 6)]


def test_summarize_trace_without_steps_is_one_span():
    ev = [X(1, "fwd", "compute", 0, 10), X(2, "push", "comm", 5, 10)]
    (p,) = tl.summarize(ev)
    (row,) = p["steps"]
    assert row["step"] == "all" and row["time_ms"] == 0.015 and row["overlap_ms"] == 0.005


def test_unreadable_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert tl.main(["summarize", str(bad)]) == 2
    assert tl.main(["summarize", str(tmp_path / "missing.json")]) == 2


def test_tracer_steps_window_and_explicit_counting(tmp_path):
    tr = trace.Tracer(tmp_path / "t.json", rank=3, start_step=1, end_step=2)
    assert not tr.on
    tr.end_step()                       # step 0 ends (optimizer)
    assert tr.on and tr.step_index == 1
    with tr.span("update", "update fc.weight"):
        pass
    tr.end_step(explicit=True)          # first explicit call right after the optimizer's: no new step
    assert tr.step_index == 1 and tr.explicit
    tr.end_step()                       # ignored from now on
    assert tr.step_index == 1
    tr.end_step(explicit=True)          # step 1 ends
    tr.end_step(explicit=True)          # step 2 ends: window closed, file final
    assert not tr.on and tr.finished
    ev, meta = tl.load_trace(tmp_path / "t.json")
    assert meta["rank"] == 3
    assert sorted(e["args"]["step"] for e in ev if e.get("cat") == "step") == [1, 2]
    assert any(e["name"] == "update fc.weight" for e in ev)
    tr.end_step(explicit=True)
    assert len(tl.load_trace(tmp_path / "t.json")[0]) == len(ev)  # nothing after the window


def test_tracer_does_not_rewrite_the_file_after_every_traced_step(tmp_path):
    """A rewrite costs the training thread time in proportion to everything recorded: inside the window the
    file is rewritten at most every FLUSH_EVERY_S seconds, and in full when the window closes."""
    path = tmp_path / "t.json"
    tr = trace.Tracer(path, rank=0, start_step=0, end_step=3)
    tr.flush()                          # what install() does: a valid, empty file
    before = path.stat().st_mtime_ns
    tr.end_step(explicit=True)          # step 0 ends, well within FLUSH_EVERY_S
    assert path.stat().st_mtime_ns == before
    assert not [e for e in tl.load_trace(path)[0] if e.get("cat") == "step"]


def test_tracer_rewrites_the_file_once_flush_every_s_has_passed(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    tr = trace.Tracer(path, rank=0, start_step=0, end_step=3)
    monkeypatch.setattr(trace, "FLUSH_EVERY_S", 0.0)
    tr.end_step(explicit=True)          # step 0 ends: due
    assert [e["args"]["step"] for e in tl.load_trace(path)[0] if e.get("cat") == "step"] == [0]


def test_module_helpers_are_noops_when_off():
    assert trace.current is None and trace.TRACER is None
    with trace.span("x", "y"):
        pass
    trace.event("x", "y", 0.0)
    trace.step()
