"""Self-describing codecs (pushpull.compression): a codec is one file that declares its name, wire id
and options and registers itself; the one registry finds it by id and by name, and nothing else needs
an edit. Here the test codec (an 8-bit linear quantiser, tests/extension_files.py) runs in a real
push_pull job whose workers and server find its temporary ``pushpull/compression`` directory on their
``sys.path``; tests/unit/test_codec_registry.py round-trips it through the registry in this process."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from extension_files import codec_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def int8q(tmp_path):
    """The new codec's file, on pushpull.compression's path while the test runs (tests/extension_files.py)."""
    with codec_file(tmp_path) as root:
        yield root


WORKER = textwrap.dedent('''
    import torch
    import pushpull.torch as bps

    bps.init()
    r, n = bps.rank(), bps.size()
    x = torch.linspace(-1.0, 1.0, 40_000) * (r + 1)
    for step in range(3):
        got = bps.push_pull(x, average=False, name="int8q.t", compression={"compressor": "int8q"})
        want = torch.linspace(-1.0, 1.0, 40_000) * sum(k + 1 for k in range(n))
        err = (got - want).abs().max().item()
        # each worker's push and the server's re-compressed sum: at most half a step each
        bound = 0.5 * sum(k + 1 for k in range(n)) / 127 + 0.5 * want.abs().max().item() / 127 + 1e-5
        assert err <= bound, (step, err, bound)
    print("ALL-OK", flush=True)
    bps.shutdown()
''')


def test_a_real_push_pull_uses_the_new_codec(int8q):
    script = int8q / "int8q_worker.py"
    script.write_text(WORKER)
    path = os.pathsep.join([str(int8q), os.environ.get("PYTHONPATH", str(ROOT))])
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1",
            "--env", "PUSHPULL_TIMEOUT=40", "--env", f"PYTHONPATH={path}", "--env", "PUSHPULL_MIN_COMPRESS_BYTES=0",
            "--", sys.executable, str(script)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert res.returncode == 0 and res.stdout.count("ALL-OK") == 2, (res.stdout + res.stderr)[-5000:]
