"""Server side of compression for one key (BytePS semantics): decode each
worker's push, sum, and compress the sum again for the pull, with the server's
own error feedback and no momentum. The error feedback rescales its residual
by the learning-rate ratio like the workers', with the rate each push carries
in its header (BytePS' servers read the same lr file as the workers)."""
from __future__ import annotations

import numpy as np
import torch

from pushpull import dtypes
from pushpull.compression import build_server, decode_payload



class ServerCodec:
    def __init__(self, spec: dict, dtype: str, numel: int, key: int = 0):
        if dtype not in dtypes.FLOAT_NAMES:
            raise ValueError(f"compression needs a floating-point tensor, got {dtype}")
        self.dtype = dtypes.to_torch(dtype)
        self.numel = numel
        self.lr = 1.0  # set from each compressed push's header: the learning rate the workers train with
        self.chain = build_server(spec, seed_offset=key, lr_getter=lambda: self.lr)

    def decompress_push(self, sender: int, buf) -> np.ndarray:
        """The push as NumPy data in the wire representation the accumulator sums."""
        t = decode_payload(buf)
        if t.numel() != self.numel or t.dtype != self.dtype:
            raise ValueError(f"rank {sender} pushed a payload of {t.dtype}[{t.numel()}], "
                             f"expected {self.dtype}[{self.numel}]")
        t = t.reshape(-1)
        if self.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()

    def compress_sum(self, total: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(total))
        if self.dtype == torch.bfloat16:
            t = t.view(torch.int16).view(torch.bfloat16)
        return self.chain.compress(t).buffer.numpy()
