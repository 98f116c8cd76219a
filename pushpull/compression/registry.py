"""Build compressor chains from small JSON-able specs.

A spec names the codec and its options in the flat style BytePS users know::

    {"compressor": "onebit", "scaling": True, "ef": "vanilla",
     "momentum": "nesterov", "mu": 0.9}

Options that do not apply to the chosen codec are ignored, so one spec can
carry settings for several; unknown keys and bad values raise ValueError.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

from .base import Compressor, check_k
from .dithering import MAX_LEVELS, NORMALIZATIONS, PARTITIONS, Dithering
from .error_feedback import ErrorFeedback
from .fp16 import FP16
from .momentum import NesterovMomentum
from .none import NoCompression
from .onebit import OneBit
from .randomk import RandomK, RandomKSum
from .topk import TopK

COMPRESSORS: dict[str, type[Compressor]] = {
    "none": NoCompression,
    "fp16": FP16,
    "onebit": OneBit,
    "topk": TopK,
    "randomk": RandomK,
    "dithering": Dithering,
}
ERROR_FEEDBACKS = ("none", "vanilla")
MOMENTUMS = ("none", "nesterov")

# key -> default; every key a spec may carry.
SPEC_DEFAULTS: dict[str, Any] = {
    "compressor": "none",
    "scaling": True,
    "k": None,
    "seed": None,
    "partition": "linear",
    "normalize": "max",
    "ef": "none",
    "momentum": "none",
    "mu": 0.9,
    # Read by the caller (tensors smaller than this are sent uncompressed),
    # accepted here so a whole training config can be passed through.
    "min_compress_bytes": 65536,
}
# Codec options each compressor reads (others in the spec are ignored).
_OPTIONS = {
    "none": (),
    "fp16": (),
    "onebit": ("scaling",),
    "topk": ("k",),
    "randomk": ("k", "seed"),
    "dithering": ("k", "partition", "normalize", "seed"),
}
_DITHERING_DEFAULT_LEVELS = 2
# BytePS seeds random-k with 2020 when no seed is given: the same on every worker.
RANDOMK_DEFAULT_SEED = 2020


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
    unknown = sorted(set(spec) - set(SPEC_DEFAULTS))
    if unknown:
        raise ValueError(f"compression spec: unknown key(s) {unknown}; valid keys: {sorted(SPEC_DEFAULTS)}")
    out = dict(SPEC_DEFAULTS)
    out.update(spec)
    out["compressor"] = _choice(out, "compressor", COMPRESSORS)
    out["ef"] = _choice(out, "ef", ERROR_FEEDBACKS)
    out["momentum"] = _choice(out, "momentum", MOMENTUMS)
    name = out["compressor"]

    if not isinstance(out["scaling"], bool):
        raise ValueError(f"compression spec: scaling must be true or false, got {out['scaling']!r}")
    seed = out["seed"]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"compression spec: seed must be a non-negative integer or null, got {seed!r}")
    mu = out["mu"]
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0.0 <= mu < 1.0:
        raise ValueError(f"compression spec: mu must be a number in [0, 1), got {mu!r}")
    mcb = out["min_compress_bytes"]
    if isinstance(mcb, bool) or not isinstance(mcb, int) or mcb < 0:
        raise ValueError(f"compression spec: min_compress_bytes must be a non-negative integer, got {mcb!r}")
    for key, valid in (("partition", PARTITIONS), ("normalize", NORMALIZATIONS)):
        if out[key] not in valid:
            raise ValueError(f"compression spec: {key}={out[key]!r} is not valid; choose from {list(valid)}")

    k = out["k"]
    if name in ("topk", "randomk"):
        if k is None:
            raise ValueError(f"compression spec: {name} needs k (a count >= 1 or a fraction in (0, 1))")
        check_k(k, f"compression spec: {name}")
    elif name == "dithering":
        if k is None:
            out["k"] = k = _DITHERING_DEFAULT_LEVELS
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k != int(k) \
                or not 1 <= k <= MAX_LEVELS:
            raise ValueError("compression spec: dithering k (levels s) must be a whole number "
                             f"in [1, {MAX_LEVELS}], got {k!r}")
        out["k"] = int(k)
    return out


def _codec(spec: dict, seed_offset: int) -> Compressor:
    name = spec["compressor"]
    kwargs = {key: spec[key] for key in _OPTIONS[name]}
    if name == "randomk":
        # BytePS: all workers share one default seed (so they pick the same indices and the
        # server's sum stays k-sparse), and the n/k scaling is on only without error feedback.
        if kwargs["seed"] is None:
            kwargs["seed"] = RANDOMK_DEFAULT_SEED
        kwargs["scale"] = spec["ef"] == "none"
    if "seed" in kwargs and kwargs["seed"] is not None:
        kwargs["seed"] = kwargs["seed"] + seed_offset
    return COMPRESSORS[name](**kwargs)


def _with_error_feedback(spec: dict, codec: Compressor, lr_getter) -> Compressor:
    return ErrorFeedback(codec, lr_getter=lr_getter) if spec["ef"] == "vanilla" else codec


def build(spec: Mapping | str | None = None, *, lr_getter: Callable[[], float] | None = None,
          seed_offset: int = 0) -> Compressor:
    """The worker chain for one tensor: momentum -> error feedback -> codec.

    ``seed_offset`` (e.g. a partition's key) is added to the spec's seed so
    different tensors draw different random streams while every worker,
    given the same spec and offset, draws the same ones.
    """
    spec = normalize_spec(spec)
    chain = _with_error_feedback(spec, _codec(spec, seed_offset), lr_getter)
    if spec["momentum"] == "nesterov":
        chain = NesterovMomentum(chain, mu=spec["mu"])
    return chain


def build_server(spec: Mapping | str | None = None, *, lr_getter: Callable[[], float] | None = None,
                 seed_offset: int = 0) -> Compressor:
    """The server chain: it re-compresses each sum with its own error feedback
    and never applies momentum (that already happened on the workers);
    random-k sums are sent on their own support (:class:`RandomKSum`).

    ``lr_getter``: the workers' current learning rate (the server codec takes it
    from each compressed push's header), so the server's error feedback
    rescales by the same ratio as the workers'.
    """
    spec = normalize_spec(spec)
    if spec["compressor"] == "randomk":
        # BytePS' server neither re-samples nor re-scales random-k: it sums the pushes on their
        # shared support and sends that back. Re-sampling would drop most of the sum (and, scaled,
        # multiply it by n/k a second time). Nothing is dropped, so no error feedback either.
        return RandomKSum()
    return _with_error_feedback(spec, _codec(spec, seed_offset), lr_getter)


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
