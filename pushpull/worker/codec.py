"""Worker side of compression for one partition: the stateful chain
(momentum -> error feedback -> compressor) before the push, and decoding of
the server's re-compressed sum after the pull.

Seeds are offset by the partition key, so every worker draws the same random
stream for the same partition and different partitions draw different ones.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import torch  # the compressors are written in torch (they also run on CUDA tensors): compression needs it

from pushpull import dtypes
from pushpull.compression import build, decode_payload


class WorkerCodec:
    def __init__(self, spec: dict, dtype: dtypes.DType, numel: int, key: int = 0,
                 lr_getter: Callable[[], float] | None = None):
        self.dtype = dtype.torch
        self.numel = numel
        self.chain = build(spec, lr_getter=lr_getter, seed_offset=key)
        # held while the chain's state changes: a compress (the I/O thread's or a codec pool thread's), an elastic
        # restore's load (the training thread: pushpull.worker.codec_state)
        self.lock = threading.Lock()

    def compress(self, raw: np.ndarray, wanted: Callable[[], bool] | None = None) -> np.ndarray | None:
        """``raw``: the partition's bytes; returns the payload's wire buffer. ``wanted`` (a pool thread's): asked
        under the lock, None when the push is no longer wanted (its op ended, the job changed): a push of before a
        change must not move the chain's state after the restore that follows it."""
        with self.lock:
            if wanted is not None and not wanted():
                return None
            t = torch.from_numpy(raw).view(self.dtype)
            return self.chain.compress(t).buffer.numpy()

    def decompress_into(self, buf, dst: np.ndarray) -> None:
        """Decode a payload into the partition's output bytes ``dst``."""
        out = torch.from_numpy(dst).view(self.dtype)
        decode_payload(buf, out=out)
