"""Gradient compression: codecs, stateful wrappers and a spec-driven registry.

Worker order is momentum -> error feedback -> codec (see ``build``); the
server decodes pushes, sums, and re-compresses with ``build_server``.
Every codec produces a :class:`Payload`, one contiguous wire buffer.
"""

from .base import Compressor, Payload, decode_payload, resolve_k
from .dithering import Dithering
from .error_feedback import ErrorFeedback
from .fp16 import FP16
from .momentum import NesterovMomentum
from .none import NoCompression
from .onebit import OneBit
from .randomk import RandomK, RandomKSum
from .registry import (
    COMPRESSORS,
    ERROR_FEEDBACKS,
    MOMENTUMS,
    build,
    build_server,
    normalize_spec,
    spec_from_json,
    spec_to_json,
)
from .topk import TopK

__all__ = [
    "COMPRESSORS",
    "Compressor",
    "Dithering",
    "ERROR_FEEDBACKS",
    "ErrorFeedback",
    "FP16",
    "MOMENTUMS",
    "NesterovMomentum",
    "NoCompression",
    "OneBit",
    "Payload",
    "RandomK",
    "RandomKSum",
    "TopK",
    "build",
    "build_server",
    "decode_payload",
    "normalize_spec",
    "resolve_k",
    "spec_from_json",
    "spec_to_json",
]
