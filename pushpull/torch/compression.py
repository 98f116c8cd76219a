"""``Compression.none`` / ``Compression.fp16`` as in Horovod and BytePS, plus
any compressor of :mod:`pushpull.compression` by spec.

A compression object carries a JSON-able ``spec``; the worker compresses each
partition before the push and the server decompresses, sums and compresses the
sum again (BytePS semantics), so the spec travels to the server in the INIT.
"""
from __future__ import annotations


class Compressor:
    def __init__(self, spec: dict | None, name: str):
        self.spec = spec
        self.name = name

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class Compression:
    """Namespace of ready-made compressions (Horovod-compatible names)."""

    none = Compressor(None, "none")
    fp16 = Compressor({"compressor": "fp16"}, "fp16")

    @staticmethod
    def build(compressor: str, **kwargs) -> Compressor:
        """Any registered compressor, e.g. ``Compression.build("onebit", scaling=True, ef="vanilla")``."""
        spec = {"compressor": compressor, **kwargs}
        try:  # validate now, where the user can see the culprit
            from pushpull.compression import build

            build(spec)
        except ImportError:
            pass
        return Compressor(spec, compressor)
