"""The test tree keeps its two kinds apart (tests/README.md): every test file is in tests/unit or
tests/cluster, so `pytest tests/unit` is the whole of the fast part."""
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_is_in_unit_or_cluster():
    stray = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                   if p.parent.name not in ("unit", "cluster") or p.parent.parent != TESTS)
    assert not stray, f"test files outside tests/unit and tests/cluster (move them; tests/README.md): {stray}"
