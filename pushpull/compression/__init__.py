"""Gradient compression: codecs, stateful wrappers and a spec-driven registry.

Worker order is momentum -> error feedback -> codec (see ``build``); the
server decodes pushes, sums, and re-compresses with ``build_server``.
Every codec produces a :class:`Payload`, one contiguous wire buffer.

A codec is one file in this package: it declares its name, wire id and options and registers itself
(``@register_codec``); importing the package imports every module in it (and in any ``pushpull/compression``
directory on ``sys.path``: :mod:`pushpull.extend`), so nothing else lists codecs.
"""

from pushpull.extend import extend_package_path as _extend, import_all as _import_all

_extend(__path__, __name__)

from .base import Codec, Option, Payload, codec_by_name, codecs, decode_payload, register_codec, resolve_k  # noqa: E402
from .dithering import Dithering  # noqa: E402
from .error_feedback import ErrorFeedback  # noqa: E402
from .fp16 import FP16  # noqa: E402
from .momentum import NesterovMomentum  # noqa: E402
from .none import NoCompression  # noqa: E402
from .onebit import OneBit  # noqa: E402
from .randomk import RandomK, RandomKSum  # noqa: E402
from .registry import (  # noqa: E402
    COMPRESSORS,
    ERROR_FEEDBACKS,
    MOMENTUMS,
    build,
    build_server,
    for_tensor,
    normalize_spec,
    spec_from_json,
    spec_to_json,
)
from .topk import TopK  # noqa: E402
from .wrapper import Wrapper  # noqa: E402


def discover() -> None:
    """Import every module of the package path, so that every codec file has registered itself (again
    after a directory was added to ``__path__``)."""
    _import_all(__path__, __name__)


discover()

__all__ = [
    "COMPRESSORS",
    "Codec",
    "Dithering",
    "ERROR_FEEDBACKS",
    "ErrorFeedback",
    "FP16",
    "MOMENTUMS",
    "NesterovMomentum",
    "NoCompression",
    "OneBit",
    "Option",
    "Payload",
    "RandomK",
    "RandomKSum",
    "TopK",
    "Wrapper",
    "build",
    "build_server",
    "codec_by_name",
    "codecs",
    "decode_payload",
    "discover",
    "for_tensor",
    "normalize_spec",
    "register_codec",
    "resolve_k",
    "spec_from_json",
    "spec_to_json",
]
