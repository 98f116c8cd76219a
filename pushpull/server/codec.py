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
from pushpull.compression.state import pack_state, unpack_state


class ServerCodec:
    def __init__(self, spec: dict, dtype: str, numel: int, key: int = 0):
        if dtype not in dtypes.FLOAT_NAMES:
            raise ValueError(f"compression needs a floating-point tensor, got {dtype}")
        self.dtype = dtypes.to_torch(dtype)
        self.numel = numel
        self.lr = 1.0  # set from each compressed push's header: the learning rate the workers train with
        self.chain = build_server(spec, seed_offset=key, lr_getter=lambda: self.lr)
        self.dtype_name = dtype
        # the job changed (set on the I/O thread at a RESET): the sums of the rounds before are gone, and so is the
        # residual they left, on this server as on a server the key moves to. Acted on by the engine thread, at its
        # next sum or state load: an engine thread may be compressing a dropped round's sum meanwhile
        self.stale = False
        self.commit = -1  # the elastic commit whose state was loaded in this generation (the newest load wins)
        # this server's own copy of the state at the last commit (its id, the state packed): a change that keeps
        # this server goes back to it (rollback) even when the worker holding the other copy was lost
        self.kept: tuple[int, bytes] | None = None

    def reset(self) -> None:
        """A new generation of workers (KeyState.reset, on the I/O thread)."""
        self.stale = True
        self.commit = -1

    def _fresh(self) -> None:
        if self.stale:
            self.stale = False
            self.chain.reset()

    def state(self, commit: int) -> bytes:
        """The error feedback's residual (and a random stream's position) as of the last sum, packed
        (pushpull.compression.state): elastic commit ``commit``'s copy, which one worker reads and this server keeps
        (1x the key's size in memory until the next commit)."""
        self._fresh()
        packed = pack_state(self.chain.state_dict())
        self.kept = (commit, packed)
        return packed

    def rollback(self, commit: int) -> bool:
        """Back to this server's own copy of commit ``commit``; False where it has none (a new server, another
        commit's): the state stays as the change left it (from zero), unless a worker's copy comes."""
        if self.kept is None or self.kept[0] != commit:
            self._fresh()
            return False
        return self.load(self.kept[1], commit)

    def load(self, buf, commit: int) -> bool:
        """Go back to a commit's state (a worker's copy, after a change); an older commit's than one loaded in
        this generation is ignored (False). ValueError: a state that is not this key's."""
        state = unpack_state(buf, self.numel, self.dtype_name)
        self._fresh()
        if commit < self.commit:
            return False
        self.chain.load_state_dict(state)
        self.commit = commit
        return True

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
        self._fresh()
        t = torch.from_numpy(np.ascontiguousarray(total))
        if self.dtype == torch.bfloat16:
            t = t.view(torch.int16).view(torch.bfloat16)
        return self.chain.compress(t).buffer.numpy()
