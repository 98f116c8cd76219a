"""Robustness of a live server against malformed input, and the Van's batching over real sockets (the
wire format alone: tests/unit/test_transport.py)."""
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from pushpull.transport.protocol import Header, MsgType
from pushpull.transport.van import Van

ROOT = Path(__file__).resolve().parents[2]


def test_live_server_survives_garbage_and_answers_errors():
    res = subprocess.run([sys.executable, "-m", "pushpull", "launch", "--workers", "1", "--servers", "1",
                          "--env", "BYTEPS_FORCE_DISTRIBUTED=1", "--",
                          sys.executable, str(ROOT / "tests" / "scripts" / "garbage_worker.py")],
                         capture_output=True, text=True, timeout=90)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "ALL-OK" in out
    assert out.count("error for") == 5, out[-3000:]


def test_van_batches_small_messages_and_keeps_order_around_large_ones():
    """Real sockets: small messages queued in one pass of the I/O loop arrive as few BATCH
    messages, in order, and a large message between them is not overtaken."""
    got, done = [], threading.Event()

    def on_msg(identity, msg):
        got.append((msg.header.key, memoryview(msg.body()).nbytes))
        if msg.header.key == 200:
            done.set()

    rx, tx = Van("rx"), Van("tx", batch_bytes=1024)
    port = rx.bind_router("r", "127.0.0.1", 0, on_msg)
    rx.start()
    tx.connect_dealer("d", f"tcp://127.0.0.1:{port}", b"tx", lambda m: None)
    tx.start()
    big = np.zeros(100_000, dtype=np.uint8)

    def burst():
        for k in range(200):
            tx.send("d", Header(MsgType.PUSH, key=k + 1), [big if k == 99 else b"x" * (k % 7)])
    tx.call_soon(burst)
    try:
        assert done.wait(10), f"only {len(got)} of 200 messages arrived"
        assert [k for k, _ in got] == list(range(1, 201))
        assert [n for _, n in got] == [100_000 if k == 99 else k % 7 for k in range(200)]
        assert 2 <= tx.batches_sent <= 4 and tx.batched_messages == 199
    finally:
        tx.stop()
        rx.stop()
