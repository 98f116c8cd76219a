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
        self.spec, self.key, self.dtype_name = spec, key, dtype
        self.chain = self._build()
        # elastic commits (pushpull.worker.codec_state): this server's own copy of the state at the last commits (id
        # -> the state packed), and the newest state loaded after a change (generation, commit): in one generation
        # the newest commit's copy wins
        self.kept: dict[int, bytes] = {}
        self.loaded = (-1, -1)

    KEPT = 2  # commits whose copy is kept: the last one, and the one before (a commit with sparse tables counts only
    #           once their copies are in, so a change meanwhile goes back to the one before)

    def _build(self):
        return build_server(self.spec, seed_offset=self.key, lr_getter=lambda: self.lr)

    def state(self, commit: int) -> bytes:
        """The error feedback's residual (and a random stream's position) as of the last sum, packed
        (pushpull.compression.state): elastic commit ``commit``'s copy, which one worker reads and this server keeps
        (the last KEPT commits': KEPT x the key's size in memory)."""
        packed = pack_state(self.chain.state_dict())
        self.kept[commit] = packed
        for old in sorted(self.kept)[:-self.KEPT]:
            del self.kept[old]
        return packed

    def rollback(self, commit: int, gen: int) -> bool:
        """After a change (generation ``gen``): back to this server's own copy of commit ``commit``. Without one (a
        server new to the key, or a commit it did not keep) the state starts from zero, and False says so: a
        worker's copy may follow (load)."""
        if self.loaded[0] == gen and self.loaded[1] >= commit:  # that commit's copy (or a newer one) is in already
            return True
        packed = self.kept.get(commit)
        if packed is None:
            self.drop(gen)
            return False
        return self.load(packed, commit, gen)

    def drop(self, gen: int) -> None:
        """From zero after a change (generation ``gen``) where nothing was loaded in it yet (a copy a worker
        loaded first, of another commit, stays: the arrival order must not decide)."""
        if self.loaded[0] != gen:
            self.chain = self._build()
            self.loaded = (gen, -1)

    def load(self, buf, commit: int, gen: int) -> bool:
        """After a change (generation ``gen``): go back to commit ``commit``'s state (a worker's copy, or this
        server's); an older commit's than one loaded in this generation is ignored (False). ValueError: a state that
        is not this key's (the codec is left as it was)."""
        if self.loaded[0] == gen and commit < self.loaded[1]:
            return False
        state = unpack_state(buf, self.numel, self.dtype_name)
        chain = self._build()  # loaded whole or not at all: a state that fails half-way leaves nothing behind
        try:
            chain.load_state_dict(state)
        except (TypeError, ValueError, AttributeError, KeyError) as e:
            raise ValueError(f"codec state: {e}") from None
        self.chain = chain
        self.loaded = (gen, commit)
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
        t = torch.from_numpy(np.ascontiguousarray(total))
        if self.dtype == torch.bfloat16:
            t = t.view(torch.int16).view(torch.bfloat16)
        return self.chain.compress(t).buffer.numpy()
