"""The wire format: one fixed-size binary header frame, then payload frames.

No pickle: the header is a ``struct``; tensor payloads are raw bytes sent
zero-copy; the few control messages that need structure (registration, the
address book, error texts) carry a UTF-8 JSON frame. A message that does not
parse raises :class:`ProtocolError`, which receivers log and answer or drop.
"""
from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass

from pushpull import dtypes as _dt

MAGIC = 0x5050  # "PP"
VERSION = 11  # 11: a key's server-side compression state read at an elastic commit and loaded back (CODEC_STATE)
#             10: an elastic commit's copy of a sparse table streamed from a snapshot (SPARSE_COPY)
#             9: a sparse table's changed rows (Flags.CHANGED; a load's Adagrad accumulators)
#             8: same-host payloads in shared memory (Flags.SHM, an INIT_ACK's region);
#             7: INIT and ASSIGN writers (the ranks that push a key: one per machine with the local reduce),
#             the address book's job_id; 6: sparse tables (SPARSE_* messages); 5: round signatures, concat
#             offsets, ABORT, INIT op/readers

# magic, version, type, dtype, flags, sender, key, round, numel, nbytes, req_id, extra, gen
# gen: the membership generation (elastic training): a message from before a change of workers is stale
_FMT = "<HBBBBiQqQQIII"
_HDR = struct.Struct(_FMT)  # compiled once: every message packs or unpacks one
HEADER_SIZE = _HDR.size


class MsgType(enum.IntEnum):
    # membership (scheduler)
    REGISTER = 1
    REGISTER_ACK = 2
    BARRIER = 3
    BARRIER_RELEASE = 4
    HEARTBEAT = 5
    HEARTBEAT_ACK = 6
    ASSIGN = 7          # worker asks where a tensor's partitions live
    ASSIGN_ACK = 8
    NODE_FAILED = 9
    FINISH = 10         # a worker is done
    TERMINATE = 11      # scheduler tells everyone to exit
    RESET = 12          # elastic: the workers changed (new generation, ranks, size); servers first
    RESET_ACK = 13      # a server applied a RESET
    PROGRESS = 14       # scheduler -> registered nodes: who the job still waits for (JSON text)
    JOIN = 15           # worker -> scheduler: this rank ran out of data (join()); key = its rank
    JOINED = 16         # scheduler -> servers: rank ``key`` joined, rounds complete without it
    # key-value (server)
    INIT = 20           # first push of a key: name, numel, dtype, compression
    INIT_ACK = 21
    PUSH = 22
    PUSH_ACK = 23
    PULL = 24
    PULL_RESP = 25
    STATUS = 26         # which ranks a key's round (or its INIT) has heard from: asked when a wait times out
    STATUS_RESP = 27
    # sparse tables (pushpull/server/sparse.py): rows of an embedding table, partitioned by row ranges
    SPARSE_INIT = 28    # declare a table's row range on this server (JSON); a barrier across workers
    SPARSE_PUSH = 29    # frames: row ids (int64), rows (float32, numel x dim); round = the worker's step
    SPARSE_PULL = 30    # frame: row ids (int64); answered once round ``round`` has been applied
    SPARSE_ROWS = 31    # answer to SPARSE_PULL: the rows (float32), in the order asked
    SPARSE_ACK = 32     # answer to SPARSE_INIT, to a SET push, and to a push that asked for it
    SPARSE_COPY = 33    # an elastic commit's copy of a table as of round ``round``; ``numel`` is the step (COPY_*)
    CODEC_STATE = 34    # a key's server-side compression state (error feedback): ``numel`` is STATE_READ or STATE_WRITE
    # either
    ERROR = 40
    BATCH = 41          # several small messages for one peer in one frame (see pack_batch)


_MSG_TYPES = {t.value: t for t in MsgType}


class Flags:
    """Header flag bits, plain ints: ``flags & Flags.X`` stays an int operation (an IntFlag's
    reflected ``&`` built an enum member for every message)."""

    NONE = 0
    COMPRESSED = 1      # payload is a compression payload, not raw dtype bytes
    PULL = 2            # a PUSH that also asks for the round's sum (one request instead of PUSH + PULL)
    NO_ACK = 4          # a PUSH whose sender wants no PUSH_ACK (no credit or trace waits on it)
    ABORT = 8           # a PUSH that fails its round on every rank; the body is JSON {"error": why}
    SET = 16            # a SPARSE_PUSH that writes rows instead of adding a round's gradient (loading a table)
    SHM = 32            # the payload is in the key's shared-memory region (pushpull.transport.shm), not in the
    #                     body: a PUSH's in the sender's slot (it asks for its answer there too); a PULL_RESP's
    #                     in output ``extra``
    CHANGED = 64        # a SPARSE_PULL of the rows of a range changed since a round (an elastic job's copy of the
    #                     table); its SPARSE_ROWS answer carries their ids, values (and Adagrad accumulators)


# SPARSE_COPY steps (in ``numel``): a worker opens the copy of round ``round`` on every server (the server then keeps
# the rows as of that round while later rounds change them), reads ranges of it a few at a time (frame: [lo, hi) as
# two int64; ``extra``: one more than the round the worker's copy is of; answered with SPARSE_ROWS|CHANGED) and
# closes it (answered with an empty SPARSE_ROWS|CHANGED); the server forgets the copy once every worker closed it
COPY_OPEN, COPY_READ, COPY_CLOSE = 1, 2, 3

# CODEC_STATE steps (in ``numel``): STATE_READ asks for the key's state as of round ``round`` (the last it completed:
# an elastic commit, every worker between steps), answered with CODEC_STATE and the state packed
# (pushpull.compression.state); STATE_WRITE loads such a state back after a change (``extra``: the commit it is
# of; the newest commit loaded in a generation wins), answered with an empty CODEC_STATE
STATE_READ, STATE_WRITE = 1, 2


# dtype code <-> dtype name (and item size): the header numbering of pushpull.dtypes
DTYPES: dict[int, tuple[str, int]] = {c: (d.name, d.itemsize) for c, d in _dt.BY_HEADER.items()}
_CODE_OF = {name: code for code, (name, _) in DTYPES.items()}


# A PUSH's req_id carries its round signature (0: none): values every worker must give equal for the round
# (a broadcast's root and dtype, an allreduce's average flag and scale factors). The server compares them
# and, when they differ, fails the round on every rank naming each rank's values. Layout: bit 31 set;
# bits 0-15 root rank; 16-20 dtype (its pushpull.dtypes ``sig`` id = SIG_DTYPES index + 1); bit 21 average;
# 22-30 a hash of the scale factors.
SIG_DTYPES = _dt.SIG_NAMES
_SIG_SET = 1 << 31
# An outer key's PUSH (DiLoCo) carries its round's id as req_id instead; this bit on it says "present, adds
# nothing": a worker that came into the running job takes part in the round it arrived in without a
# pseudo-gradient, so the mean stays the others' (pushpull.torch.diloco)
OUTER_PRESENT_ONLY = 1 << 30


def round_sig(root: int | None = None, dtype: str | None = None, average: bool | None = None,
              scale: tuple[float, float] = (1.0, 1.0)) -> int:
    sig = _SIG_SET
    if root is not None:
        sig |= root & 0xFFFF
    if dtype is not None:
        sig |= (_dt.BY_NAME[dtype].sig if dtype in _dt.BY_NAME else _dt.SIG_UNKNOWN) << 16
    if average:
        sig |= 1 << 21
    if tuple(scale) != (1.0, 1.0):
        import zlib

        sig |= ((zlib.crc32(struct.pack("<dd", *scale)) % 511) + 1) << 22
    return sig


def describe_sig(sig: int) -> dict:
    """The fields of a round signature, as a worker gave them (for error messages)."""
    code = (sig >> 16) & 31
    return {"root_rank": sig & 0xFFFF,
            "dtype": SIG_DTYPES[code - 1] if 0 < code <= len(SIG_DTYPES) else ("?" if code else None),
            "average": bool(sig >> 21 & 1),
            "prescale_factor/postscale_factor": f"#{(sig >> 22) & 511}" if (sig >> 22) & 511 else "1.0/1.0"}


class ProtocolError(ValueError):
    """A message could not be understood; the text says why."""


def dtype_code(name: str) -> int:
    try:
        return _CODE_OF[name]
    except KeyError:
        raise ProtocolError(f"dtype {name!r} cannot be sent; supported: {', '.join(_CODE_OF)}") from None


def dtype_name(code: int) -> str:
    try:
        return DTYPES[code][0]
    except KeyError:
        raise ProtocolError(f"unknown dtype code {code}") from None


@dataclass(slots=True)  # slots: no per-header dict, for a message's worth of microseconds
class Header:
    type: int
    sender: int = -1
    key: int = 0
    round: int = 0
    dtype: int = 0
    numel: int = 0
    nbytes: int = 0
    req_id: int = 0
    flags: int = 0
    extra: int = 0
    gen: int = 0

    def pack(self) -> bytes:
        return _HDR.pack(MAGIC, VERSION, self.type, self.dtype, self.flags, self.sender,
                         self.key, self.round, self.numel, self.nbytes, self.req_id, self.extra, self.gen)

    @classmethod
    def unpack(cls, buf) -> "Header":
        if len(buf) != HEADER_SIZE:
            raise ProtocolError(f"header is {len(buf)} bytes, expected {HEADER_SIZE}")
        magic, ver, typ, dt, flags, sender, key, rnd, numel, nbytes, req_id, extra, gen = _HDR.unpack(buf)
        if magic != MAGIC:
            raise ProtocolError(f"bad magic 0x{magic:04x}")
        if ver != VERSION:
            raise ProtocolError(f"protocol version {ver}, this build speaks {VERSION}")
        typ_member = _MSG_TYPES.get(typ)  # a dict lookup: MsgType(typ) costs microseconds per message
        if typ_member is None:
            raise ProtocolError(f"unknown message type {typ}")
        typ = typ_member
        return cls(typ, sender, key, rnd, dt, numel, nbytes, req_id, flags, extra, gen)


def is_answer(buf, typ: int, key: int, rnd: int, gen: int) -> bool:
    """Whether ``buf`` is a well-formed header of a ``typ`` message for round ``rnd`` of ``key`` in generation
    ``gen``, with an uncompressed body: the direct path's test of the answer it waits for, read from the
    header's fields without building a :class:`Header` (whatever fails it goes through :func:`decode`)."""
    if len(buf) != HEADER_SIZE:
        return False
    magic, ver, t, _, flags, _, k, r, _, _, _, _, g = _HDR.unpack(buf)
    return (t == typ and k == key and r == rnd and g == gen and magic == MAGIC and ver == VERSION
            and not flags & Flags.COMPRESSED)


@dataclass
class Msg:
    header: Header
    frames: list  # payload frames (zmq.Frame or bytes-like)

    def body(self):
        return self.frames[0] if self.frames else b""

    def body_view(self) -> memoryview:
        """The body's bytes without a copy (a received zmq.Frame, bytes, or a view of a batch)."""
        return frame_view(self.body())


def frame_view(frame) -> memoryview:
    """A frame's bytes without a copy: a received zmq.Frame's buffer, or a view of bytes or an array."""
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def decode(frames: list) -> Msg:
    """Parse a multipart message (without any ROUTER identity frame)."""
    if not frames:
        raise ProtocolError("empty message")
    first = frames[0]
    buf = first.buffer if hasattr(first, "buffer") else first
    return Msg(Header.unpack(bytes(buf)), list(frames[1:]))


# a batched message: its header, then its body's length (NO_BODY: the message had no body frame), then the body
_LEN = struct.Struct("<I")
NO_BODY = 0xFFFFFFFF
BATCHED_OVERHEAD = HEADER_SIZE + _LEN.size  # bytes a message adds to a batch besides its body


def pack_batch(messages: list) -> list:
    """Frames of one BATCH message carrying ``messages`` (lists ``[header bytes]`` or
    ``[header bytes, body]``). Small messages pay per-message costs far above their
    bytes (a zmq message, a poll wake-up and a Python dispatch at each end); one
    frame holding all of them pays those once."""
    parts: list = []
    for m in messages:
        parts.append(m[0])
        if len(m) > 1:
            body = m[1]
            parts.append(_LEN.pack(memoryview(body).nbytes))
            parts.append(body)
        else:
            parts.append(_LEN.pack(NO_BODY))
    return [Header(MsgType.BATCH, numel=len(messages)).pack(), b"".join(parts)]


def messages(frames: list) -> tuple:
    """The messages in one received multipart message (a BATCH's, or the one), or () when it is malformed: what a
    blocking caller of its own socket reads (the direct path, sparse tables, the compression state's copies)."""
    try:
        msg = decode(frames)
        return tuple(unpack_batch(msg)) if msg.header.type is MsgType.BATCH else (msg,)
    except ProtocolError:
        return ()


def unpack_batch(msg: "Msg") -> list:
    """The messages inside a BATCH, each a :class:`Msg` whose body is a view of the batch frame."""
    buf = msg.body_view()
    out, off, end = [], 0, len(buf)
    for _ in range(msg.header.numel):
        if off + BATCHED_OVERHEAD > end:
            raise ProtocolError(f"batch of {msg.header.numel} messages truncated after {len(out)}")
        header = Header.unpack(bytes(buf[off:off + HEADER_SIZE]))
        if header.type == MsgType.BATCH:
            raise ProtocolError("a batch inside a batch")
        (n,) = _LEN.unpack_from(buf, off + HEADER_SIZE)
        off += BATCHED_OVERHEAD
        if n == NO_BODY:
            out.append(Msg(header, []))
            continue
        if off + n > end:
            raise ProtocolError(f"batched {header.type.name} body of {n} bytes runs past the batch")
        out.append(Msg(header, [buf[off:off + n]]))
        off += n
    if off != end:
        raise ProtocolError(f"{end - off} stray bytes after a batch of {msg.header.numel} messages")
    return out


def f32_bits(x: float) -> int:
    """A float carried in a header's 32-bit ``extra`` field (a compressed push's learning rate)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def backup_extra(count: int, ahead: int) -> int:
    """A backup-workers key's PULL_RESP ``extra``: the pushes its sum holds (low 16 bits: the divisor of an
    average) and the rounds completed after the answered one (high 16 bits, capped), 0 meaning neither."""
    return (min(count, 0xFFFF) & 0xFFFF) | (min(max(ahead, 0), 0xFFFF) << 16)


def split_backup_extra(extra: int) -> tuple[int, int]:
    """(count, ahead) from :func:`backup_extra`'s value."""
    return extra & 0xFFFF, extra >> 16


def bits_f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def encode_json(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_json(frame) -> dict:
    buf = frame.bytes if hasattr(frame, "bytes") else bytes(frame)
    try:
        obj = json.loads(buf.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"bad JSON frame: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("JSON frame is not an object")
    return obj
