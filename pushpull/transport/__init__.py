"""Transport layer: a fixed binary header plus raw payload frames over ZeroMQ.

Nothing here knows about tensors' meaning, rounds or ranks' roles: that is the
cluster, server and worker layers' business (ps-lite's Van)."""
from pushpull.transport.protocol import (  # noqa: F401
    DTYPES, Header, Msg, ProtocolError, decode, dtype_code, dtype_name, encode_json, decode_json,
)
