"""Wire format and robustness of a live server against malformed input."""
import subprocess
import sys
from pathlib import Path

import pytest

from pushpull.transport.protocol import HEADER_SIZE, Header, MsgType, ProtocolError, decode, dtype_code, dtype_name

ROOT = Path(__file__).resolve().parents[1]


def test_header_round_trip():
    h = Header(MsgType.PUSH, sender=3, key=(7 << 24) | 5, round=42, dtype=dtype_code("bfloat16"), numel=10,
               nbytes=20, req_id=9, flags=1, extra=2)
    buf = h.pack()
    assert len(buf) == HEADER_SIZE
    assert decode([buf, b"x" * 20]).header == h
    assert dtype_name(h.dtype) == "bfloat16"


@pytest.mark.parametrize("buf,match", [
    (b"short", "header is 5 bytes"),
    (b"\x00" * HEADER_SIZE, "bad magic"),
    (Header(MsgType.PUSH).pack()[:2] + b"\x09" + Header(MsgType.PUSH).pack()[3:], "protocol version"),
    (Header(MsgType.PUSH).pack()[:3] + b"\xee" + Header(MsgType.PUSH).pack()[4:], "unknown message type"),
])
def test_malformed_headers_raise_protocol_error(buf, match):
    with pytest.raises(ProtocolError, match=match):
        decode([buf])


def test_unknown_dtype_is_named():
    with pytest.raises(ProtocolError, match="complex64"):
        dtype_code("complex64")


def test_live_server_survives_garbage_and_answers_errors():
    res = subprocess.run([sys.executable, "-m", "pushpull", "launch", "--workers", "1", "--servers", "1",
                          "--env", "BYTEPS_FORCE_DISTRIBUTED=1", "--",
                          sys.executable, str(ROOT / "tests" / "scripts" / "garbage_worker.py")],
                         capture_output=True, text=True, timeout=90)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "ALL-OK" in out
    assert out.count("error for") == 5, out[-3000:]
