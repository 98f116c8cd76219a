"""Build compressor chains from small JSON-able specs.

A spec names the codec and its options in the flat style BytePS users know::

    {"compressor": "onebit", "scaling": True, "ef": "vanilla",
     "momentum": "nesterov", "mu": 0.9}

Nothing here knows a particular codec: each codec file declares its name, wire id and options
(:class:`~pushpull.compression.base.Option`: default and check) and registers itself
(``@register_codec``, one registry by wire id, also searched by name); error feedback and momentum are
:class:`~pushpull.compression.wrapper.Wrapper` s that declare the spec key that switches them on.
Options that do not apply to the chosen codec are ignored, so one spec can carry settings for several;
unknown keys and bad values raise ValueError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Callable

from pushpull.config import DEFAULTS

from .base import Codec, codec_by_name, codecs
from .error_feedback import ErrorFeedback
from .momentum import NesterovMomentum
from .wrapper import Wrapper

# the stateful stages, innermost first (worker chain: momentum -> error feedback -> codec)
WRAPPERS: tuple[type[Wrapper], ...] = tuple(sorted((ErrorFeedback, NesterovMomentum), key=lambda w: w.order))
ERROR_FEEDBACKS = ("none", ErrorFeedback.value)
MOMENTUMS = ("none", NesterovMomentum.value)
# Read by the caller (tensors smaller than this are sent uncompressed), accepted in a spec so a whole
# training config can be passed through; the engine's default is PUSHPULL_MIN_COMPRESS_BYTES.
MIN_COMPRESS_BYTES = DEFAULTS.min_compress_bytes


class _Codecs(Mapping):
    """name -> codec class, a live view of the one registry (a codec registered later shows up)."""

    def __getitem__(self, name: str) -> type[Codec]:
        cls = codec_by_name(name)
        if cls is None:
            raise KeyError(name)
        return cls

    def __iter__(self):
        return iter([c.name for c in codecs()])

    def __len__(self) -> int:
        return len(codecs())


COMPRESSORS: Mapping[str, type[Codec]] = _Codecs()


def spec_defaults() -> dict[str, Any]:
    """Every key a spec may carry -> its default."""
    out: dict[str, Any] = {"compressor": "none"}
    for c in codecs():
        out.update({k: o.default for k, o in c.options.items()})
    for w in WRAPPERS:
        out[w.key] = "none"
        out.update({k: o.default for k, o in w.options.items()})
    out["min_compress_bytes"] = MIN_COMPRESS_BYTES
    return out


def _checks() -> dict[str, Callable[[Any], None]]:
    out = {}
    for owner in (*codecs(), *WRAPPERS):
        out.update({k: o.check for k, o in owner.options.items() if o.check is not None})
    return out


def _choice(spec: Mapping, key: str, valid) -> str:
    value = spec[key]
    if value is None or value is False:
        value = "none"
    if not isinstance(value, str) or value.lower() not in valid:
        raise ValueError(f"compression spec: {key}={value!r} is not valid; choose from {list(valid)}")
    return value.lower()


def normalize_spec(spec: Mapping | str | None) -> dict:
    """Validate ``spec`` and fill in defaults; the result is JSON-able."""
    if spec is None:
        spec = {}
    elif isinstance(spec, str):
        spec = {"compressor": spec}
    elif not isinstance(spec, Mapping):
        raise ValueError(f"compression spec must be a dict, a name or None, got {type(spec).__name__}")
    defaults = spec_defaults()
    unknown = sorted(set(spec) - set(defaults))
    if unknown:
        raise ValueError(f"compression spec: unknown key(s) {unknown}; valid keys: {sorted(defaults)}")
    out = dict(defaults)
    out.update(spec)
    out["compressor"] = _choice(out, "compressor", COMPRESSORS)
    for w in WRAPPERS:
        out[w.key] = _choice(out, w.key, ("none", w.value))
    for key, check in _checks().items():
        check(out[key])
    mcb = out["min_compress_bytes"]
    if isinstance(mcb, bool) or not isinstance(mcb, int) or mcb < 0:
        raise ValueError(f"compression spec: min_compress_bytes must be a non-negative integer, got {mcb!r}")
    COMPRESSORS[out["compressor"]].normalize(out)
    return out


def _wrap(spec: dict, chain: Codec, lr_getter, server: bool) -> Codec:
    for w in WRAPPERS:
        if spec[w.key] == w.value and (w.on_server or not server):
            chain = w.wrap(chain, spec, lr_getter)
    return chain


def build(spec: Mapping | str | None = None, *, lr_getter: Callable[[], float] | None = None,
          seed_offset: int = 0) -> Codec:
    """The worker chain for one tensor: momentum -> error feedback -> codec.

    ``seed_offset`` (e.g. a partition's key) is added to the spec's seed so
    different tensors draw different random streams while every worker,
    given the same spec and offset, draws the same ones.
    """
    spec = normalize_spec(spec)
    return _wrap(spec, COMPRESSORS[spec["compressor"]].from_spec(spec, seed_offset), lr_getter, server=False)


def build_server(spec: Mapping | str | None = None, *, lr_getter: Callable[[], float] | None = None,
                 seed_offset: int = 0) -> Codec:
    """The server chain: it re-compresses each sum with its own error feedback
    and never applies momentum (that already happened on the workers); a codec may
    choose otherwise (random-k sums are sent on their own support: :class:`RandomKSum`).

    ``lr_getter``: the workers' current learning rate (the server codec takes it
    from each compressed push's header), so the server's error feedback
    rescales by the same ratio as the workers'.
    """
    spec = normalize_spec(spec)
    return COMPRESSORS[spec["compressor"]].server_chain(
        spec, seed_offset, lambda codec: _wrap(spec, codec, lr_getter, server=True))


def for_tensor(spec: Mapping | str | None, nbytes: int, floating: bool, default_min_bytes: int) -> dict | None:
    """The compression one tensor of ``nbytes`` gets, or None (sent raw).

    Only floating tensors of at least ``min_compress_bytes`` are compressed (the spec's value when it
    gives one, else ``default_min_bytes``: PUSHPULL_MIN_COMPRESS_BYTES); below it the per-message cost
    outweighs the bytes saved. A wrapper that must see every tensor (momentum: it replaces the
    optimizer's) still applies to a smaller one, over the identity codec and without the others.
    Raises ValueError for a bad spec.
    """
    if not spec:
        return None
    explicit_min = isinstance(spec, Mapping) and "min_compress_bytes" in spec
    spec = normalize_spec(spec)
    min_bytes = spec["min_compress_bytes"] if explicit_min else default_min_bytes
    if spec["compressor"] == "none" and all(spec[w.key] == "none" for w in WRAPPERS):
        return None
    if not floating:
        return None
    if nbytes >= min_bytes:
        return spec
    every = [w for w in WRAPPERS if w.every_tensor and spec[w.key] == w.value]
    if every and nbytes > 0:
        return dict(spec, compressor="none", **{w.key: "none" for w in WRAPPERS if w not in every})
    return None


def spec_to_json(spec: Mapping | str | None) -> str:
    """Canonical JSON of a validated spec, for the init message."""
    return json.dumps(normalize_spec(spec), sort_keys=True, separators=(",", ":"))


def spec_from_json(text: str | bytes) -> dict:
    """Parse and validate a spec sent with :func:`spec_to_json`."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"compression spec is not valid JSON: {exc}") from None
    return normalize_spec(spec)
