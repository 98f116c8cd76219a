"""Wire payload and the compressor interface.

A :class:`Payload` is exactly one contiguous ``uint8`` buffer so the transport
can hand it to ZeroMQ as a single zero-copy frame:

    offset 0   fixed 40-byte little-endian header (``HEADER``)
    offset 40  the original shape, one int64 per dimension
    then       the codec's body sections, each starting on an 8-byte boundary

The header carries everything a receiver in another process needs to decode
(codec id, original dtype, shape, numel, one float64 scale, one uint32
parameter, one uint64 count, 16 flag bits); the section layout is a pure
function of those fields, so the buffer holds no per-section table.
"""

from __future__ import annotations

import math
import struct
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch

from pushpull import dtypes as _dt

__all__ = [
    "Payload",
    "Codec",
    "decode_payload",
    "register_codec",
    "codec_by_name",
    "codecs",
    "Option",
    "SEED",
    "resolve_k",
    "HEADER",
    "CHUNK",
]

# magic, version, codec, dtype code, ndim, flags, numel, scale, param, reserved, count
HEADER = struct.Struct("<2sBBBBHQdIIQ")
MAGIC = b"PP"
VERSION = 1
_ALIGN = 8

# Elements processed per step by the chunked kernels: small enough that the
# temporaries of one step stay in the L2 cache, large enough that the
# per-call overhead of NumPy is noise.
CHUNK = 1 << 16

# payload dtype id <-> torch dtype: the ``payload`` numbering of pushpull.dtypes
_DTYPES: dict[int, torch.dtype] = {code: d.torch for code, d in _dt.BY_PAYLOAD.items()}
_DTYPE_CODE = {dt: code for code, dt in _DTYPES.items()}
FLOAT_DTYPES = tuple(_dt.to_torch(n) for n in _dt.FLOAT_NAMES)

# The one codec registry: wire id -> codec class, filled by @register_codec when a codec's module is
# imported (pushpull.compression imports every module of the package); names are looked up in it too.
_CODECS: dict[int, type["Codec"]] = {}


def register_codec(cls: type["Codec"]) -> type["Codec"]:
    """Class decorator: make payloads with ``cls.codec`` decodable anywhere and ``cls.name`` usable in
    a compression spec. The id is what travels (one byte); the name and the options are the spec's."""
    if not 0 <= cls.codec <= 255:
        raise ValueError(f"codec {cls.__name__}: wire id must be 0..255 (one byte), got {cls.codec}")
    other = _CODECS.get(cls.codec)
    if other is not None and (other.__module__, other.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"codec id {cls.codec} used by both {other.__name__} and {cls.__name__}")
    named = codec_by_name(cls.name)
    if named is not None and named.codec != cls.codec and named.__qualname__ != cls.__qualname__:
        raise ValueError(f"codec name {cls.name!r} used by both {named.__name__} (id {named.codec}) and "
                         f"{cls.__name__} (id {cls.codec})")
    for key, opt in cls.options.items():
        for o in _CODECS.values():
            theirs = o.options.get(key)
            if o.codec != cls.codec and theirs is not None and theirs.default != opt.default:
                raise ValueError(f"codec {cls.name!r}: option {key!r} defaults to {opt.default!r}, codec "
                                 f"{o.name!r} has it default to {theirs.default!r}; one spec key has one default")
    _CODECS[cls.codec] = cls
    return cls


def codec_by_name(name: str) -> type["Codec"] | None:
    for cls in _CODECS.values():
        if cls.name == name:
            return cls
    return None


def codecs() -> list[type["Codec"]]:
    """Every registered codec, by wire id."""
    return [_CODECS[i] for i in sorted(_CODECS)]


@dataclass(frozen=True)
class Option:
    """A key of the compression spec that a codec (or a wrapper) reads: its default, and ``check``, which
    raises ValueError naming the key for a bad value. Checks run whichever codec the spec picks (a
    spec may carry settings for several); what only makes sense for the chosen codec goes in its
    :meth:`Codec.normalize`."""

    default: Any = None
    check: Callable[[Any], None] | None = None
    doc: str = ""


def _check_seed(seed) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"compression spec: seed must be a non-negative integer or null, got {seed!r}")


SEED = Option(None, _check_seed, "random seed (null: the codec's default); offset per partition key")


def _codec_class(codec: int) -> type["Codec"]:
    try:
        return _CODECS[codec]
    except KeyError:
        raise ValueError(
            f"unknown codec id {codec}; known: {sorted(_CODECS)} "
            "(import pushpull.compression to register all codecs)"
        ) from None


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _as_uint8_array(buf) -> np.ndarray:
    """Zero-copy uint8 view of anything with the buffer protocol (or a tensor)."""
    if isinstance(buf, torch.Tensor):
        return buf.detach().reshape(-1).view(torch.uint8).numpy()
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


class Payload:
    """A compressed tensor as it travels: header fields plus typed body views.

    ``buffer`` is the whole wire image; ``sections`` are views into it, so a
    compressor writes its output straight into the bytes that get sent.
    """

    __slots__ = ("codec", "dtype", "shape", "scale", "param", "count", "flags", "buffer", "sections")

    def __init__(self, codec, dtype, shape, scale, param, count, flags, buffer, sections):
        self.codec: int = codec
        self.dtype: torch.dtype = dtype
        self.shape: tuple[int, ...] = shape
        self.scale: float = scale
        self.param: int = param
        self.count: int = count
        self.flags: int = flags
        self.buffer: torch.Tensor = buffer
        self.sections: list[torch.Tensor] = sections

    # -- construction ---------------------------------------------------
    @classmethod
    def allocate(
        cls,
        codec: int,
        dtype: torch.dtype,
        shape: Sequence[int],
        *,
        scale: float = 0.0,
        param: int = 0,
        count: int = 0,
        flags: int = 0,
    ) -> "Payload":
        """Fresh buffer with the header written, the gaps between sections zeroed, and the sections
        uninitialised (every codec fills its own).

        A fresh buffer each call (rather than a reused one) because the
        transport may still be sending the previous payload without a copy.
        """
        shape = tuple(int(d) for d in shape)
        numel = math.prod(shape)
        layout = _codec_class(codec).layout(numel, dtype, param, count, flags)
        offsets, total = cls._offsets(len(shape), layout)
        buffer = torch.empty(total, dtype=torch.uint8)
        end = HEADER.size + 8 * len(shape)
        for (dt, n), off in zip(layout, offsets):  # the alignment gaps: no stale memory goes on the wire
            buffer[end:off] = 0
            end = off + n * _itemsize(dt)
        payload = cls(codec, dtype, shape, float(scale), int(param), int(count), int(flags), buffer,
                      cls._views(buffer, layout, offsets))
        payload._write_header()
        return payload

    @classmethod
    def from_buffer(cls, buf) -> "Payload":
        """Rebuild a payload from a received buffer without copying the body."""
        arr = _as_uint8_array(buf)
        if arr.size < HEADER.size:
            raise ValueError(f"payload buffer too short: {arr.size} bytes < header {HEADER.size}")
        magic, version, codec, dcode, ndim, flags, numel, scale, param, _res, count = HEADER.unpack_from(arr, 0)
        if magic != MAGIC:
            raise ValueError(f"not a pushpull payload (magic {magic!r}, expected {MAGIC!r})")
        if version != VERSION:
            raise ValueError(f"payload version {version} not supported (expected {VERSION})")
        dtype = _DTYPES.get(dcode)
        if dtype is None:
            raise ValueError(f"payload has unknown dtype code {dcode}")
        shape = struct.unpack_from(f"<{ndim}q", arr, HEADER.size)
        if math.prod(shape) != numel:
            raise ValueError(f"payload shape {shape} does not match numel {numel}")
        layout = _codec_class(codec).layout(numel, dtype, param, count, flags)
        offsets, total = cls._offsets(ndim, layout)
        if arr.size < total:
            raise ValueError(f"payload truncated: {arr.size} bytes, format needs {total}")
        with warnings.catch_warnings():
            # bytes from the socket are read-only; decoders only read them.
            warnings.simplefilter("ignore", UserWarning)
            buffer = torch.from_numpy(arr[:total])
        return cls(codec, dtype, tuple(shape), scale, param, count, flags, buffer,
                   cls._views(buffer, layout, offsets))

    @staticmethod
    def _offsets(ndim: int, layout) -> tuple[list[int], int]:
        pos = HEADER.size + 8 * ndim  # a multiple of 8 already
        offsets = []
        for dt, n in layout:
            pos = _align(pos)  # sections start aligned; the buffer ends unpadded
            offsets.append(pos)
            pos += n * _itemsize(dt)
        return offsets, pos

    @staticmethod
    def _views(buffer: torch.Tensor, layout, offsets) -> list[torch.Tensor]:
        views = []
        for (dt, n), off in zip(layout, offsets):
            views.append(buffer[off: off + n * _itemsize(dt)].view(dt))
        return views

    def _write_header(self) -> None:
        arr = self.buffer.numpy()
        HEADER.pack_into(arr, 0, MAGIC, VERSION, self.codec, _DTYPE_CODE[self.dtype], len(self.shape),
                         self.flags, self.numel, self.scale, self.param, 0, self.count)
        struct.pack_into(f"<{len(self.shape)}q", arr, HEADER.size, *self.shape)

    def set_scale(self, scale: float) -> None:
        """Patch the scale after the body was written (kernels that learn it late)."""
        self.scale = float(scale)
        self._write_header()

    # -- wire -----------------------------------------------------------
    def to_buffer(self) -> memoryview:
        """The wire image as a zero-copy memoryview (one ZeroMQ frame)."""
        return memoryview(self.buffer.numpy())

    @property
    def nbytes(self) -> int:
        return int(self.buffer.numel())

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        name = getattr(_CODECS.get(self.codec), "name", self.codec)
        return (f"Payload({name}, dtype={self.dtype}, shape={self.shape}, nbytes={self.nbytes}, "
                f"scale={self.scale:g}, param={self.param}, count={self.count}, flags={self.flags:#x})")


def _itemsize(dt: torch.dtype) -> int:
    return dt.itemsize


def decode_payload(payload, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode a Payload (or its wire buffer) with the codec named in its header.

    Stateless, so a server can decode pushes from any worker.
    """
    if not isinstance(payload, Payload):
        payload = Payload.from_buffer(payload)
    return _codec_class(payload.codec).decode(payload, out)


def resolve_k(k: float, numel: int) -> int:
    """k >= 1 is a count, 0 < k < 1 a fraction of numel (at least one element)."""
    if numel == 0:
        return 0
    if k >= 1:
        return min(int(k), numel)
    return min(numel, max(1, int(k * numel)))


def check_k(k, who: str) -> float:
    """Validate a top-k/random-k ``k`` early, with a message naming it."""
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 0:
        raise ValueError(f"{who}: k must be a count >= 1 or a fraction in (0, 1), got {k!r}")
    if k >= 1 and k != int(k):
        raise ValueError(f"{who}: k >= 1 is an element count and must be whole, got {k!r}")
    return float(k)


def require_k(spec: dict, name: str) -> None:
    """A spec's ``k`` for a sparsifier: required, and a count or a fraction."""
    if spec["k"] is None:
        raise ValueError(f"compression spec: {name} needs k (a count >= 1 or a fraction in (0, 1))")
    check_k(spec["k"], f"compression spec: {name}")


def make_rng(seed: int | None) -> np.random.Generator:
    """PCG64: seeded and reproducible, and several times faster than torch's
    CPU Mersenne Twister for bulk draws. ``None`` seeds from the OS."""
    return np.random.Generator(np.random.PCG64(seed))


def elements_option(key: str) -> Callable[[object], None]:
    """The check of an option that counts elements per scale (int8's ``block``, int4's ``group``): an integer
    in [1, 2**24]; the error names ``key``."""
    def check(v) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 24:
            raise ValueError(f"compression spec: {key} must be an integer in [1, 2**24], got {v!r}")
    return check


def block_scales(x: np.ndarray, block: int, levels: int, scales: np.ndarray) -> np.ndarray:
    """Each block of ``block`` elements' largest magnitude / ``levels`` into ``scales`` (the last block may be
    short); returns the inverse, 0 where a block is all zeros (the int8 and int4 codecs' per-block scales)."""
    n = x.size
    full = n // block * block
    if full:
        np.max(np.abs(x[:full].reshape(-1, block)), axis=1, out=scales[: full // block])
    if full < n:
        scales[-1] = np.max(np.abs(x[full:]))
    scales /= np.float32(levels)
    return np.divide(np.float32(1), scales, out=np.zeros_like(scales), where=scales > 0)


def flat_input(tensor: torch.Tensor, compute_dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
    """Contiguous 1-D view of a float tensor, cast to ``compute_dtype`` if needed."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in FLOAT_DTYPES:
        raise ValueError(f"only floating tensors can be compressed, got {tensor.dtype}")
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    flat = tensor.detach().reshape(-1)
    if compute_dtype is not None and flat.dtype != compute_dtype:
        flat = flat.to(compute_dtype)
    return flat.contiguous()


def output_for(payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
    """The tensor to decode into: ``out`` if given (checked), else a fresh one."""
    if out is None:
        return torch.empty(payload.shape, dtype=payload.dtype)
    if out.numel() != payload.numel:
        raise ValueError(f"out has {out.numel()} elements, payload has {payload.numel}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    return out


def decode_into(out: torch.Tensor, fill: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """Run ``fill`` on a flat fp32 view of ``out`` (via a temporary if needed)."""
    flat = out.view(-1)
    if flat.dtype == torch.float32:
        fill(flat)
    else:
        tmp = torch.empty(flat.numel(), dtype=torch.float32)
        fill(tmp)
        flat.copy_(tmp)
    return out


def lut_decode(packed: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    """out[i*per:(i+1)*per] = table[packed[i]]: one gather per byte.

    Every packed format here (sign bits, 2/4/8-bit level codes) decodes by
    looking up each byte in a (256, per) float32 table, which NumPy's ``take``
    copies row by row without per-element arithmetic.
    """
    n = out.size
    per = table.shape[1]
    full = n // per
    step = max(1, CHUNK // per)
    for start in range(0, full, step):
        stop = min(full, start + step)
        np.take(table, packed[start:stop], axis=0, out=out[start * per: stop * per].reshape(-1, per))
    rem = n - full * per
    if rem:
        out[full * per:] = table[packed[full], :rem]


class Codec:
    """Turns one tensor into a :class:`Payload` and back.

    Instances are per tensor (or per partition): wrappers such as error
    feedback keep state that belongs to exactly one gradient.
    """

    codec: ClassVar[int] = -1               # wire id (one byte in the payload header)
    name: ClassVar[str] = "abstract"        # the spec's "compressor"
    options: ClassVar[dict[str, Option]] = {}  # the spec keys it reads -> default and check

    # -- what the registry asks of a codec (class level) ------------------
    @classmethod
    def normalize(cls, spec: dict) -> None:
        """Complete and validate ``spec`` (a dict with every key) when this codec is the chosen one."""

    @classmethod
    def from_spec(cls, spec: dict, seed_offset: int = 0) -> "Codec":
        """The worker's codec for one partition: its options from the spec, a seed offset by the key."""
        kwargs = {key: spec[key] for key in cls.options}
        if kwargs.get("seed") is not None:
            kwargs["seed"] = kwargs["seed"] + seed_offset
        return cls(**kwargs)

    @classmethod
    def server_chain(cls, spec: dict, seed_offset: int, wrap: Callable[["Codec"], "Codec"]) -> "Codec":
        """What the server re-compresses each sum with: by default the same codec under the server-side
        wrappers (``wrap``: error feedback)."""
        return wrap(cls.from_spec(spec, seed_offset))

    def compress(self, tensor: torch.Tensor) -> Payload:
        raise NotImplementedError

    def decompress(self, payload, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode to the original shape and dtype (into ``out`` when given)."""
        return decode_payload(payload, out)

    def reset(self) -> None:
        """Forget per-tensor state (residuals, momentum). Stateless: nothing."""

    # a codec that draws from a random stream keeps it here (random-k, dithering): its position is state
    _rng: np.random.Generator | None = None

    def state_dict(self) -> dict:
        """What this codec carries from one compress to the next (a residual, momentum, a random stream's
        position), as name -> tensor, number, JSON-able value or None; tensors are its own, not copies. Why: an
        elastic commit keeps it, so that a restore sends the replayed steps through the codec as it was at the
        commit (docs/elastic.md); without it a replayed step's momentum or residual counts twice."""
        return {} if self._rng is None else {"rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        """Go back to a :meth:`state_dict` (its tensors are copied). ValueError: names this codec does not have."""
        unknown = sorted(set(state) - ({"rng"} if self._rng is not None else set()))
        if unknown:
            raise ValueError(f"{self.name}: no state named {unknown}")
        if "rng" in state:
            self._rng.bit_generator.state = state["rng"]  # NumPy checks it (a dict of the generator's kind)

    # -- codec hooks (class level; used by Payload and decode_payload) ----
    @staticmethod
    def layout(numel: int, dtype: torch.dtype, param: int, count: int, flags: int) -> list[tuple[torch.dtype, int]]:
        """Body sections as (dtype, element count), derived from header fields."""
        raise NotImplementedError

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
