"""The engine's side of the direct path: when a blocking push_pull may skip the engine's I/O thread, and
what it does with the answer (the exchange itself is :mod:`pushpull.worker.direct`).

Why apart from the engine: it is the caller's thread doing the whole call, with its own checks, deadline
and failure handling; the engine hands it its table, averager and socket and keeps moving tensors.
"""
from __future__ import annotations

import time

import zmq

from pushpull.transport.protocol import Flags, Header, MsgType, encode_json
from pushpull.worker.handle import PushPullError, WorkersChanged
from pushpull.worker.table import FAILED, PLAIN, READY, Entry, KeySpec
from pushpull.worker.tensors import kind_of


class DirectCalls:
    """A worker's blocking calls on the caller's thread (``Engine.direct_calls``)."""

    def __init__(self, engine):
        self.eng = engine

    def push_pull_now(self, tensor, output, name: str, average: bool, sig: int = 0, spec: KeySpec = PLAIN):
        """A blocking push_pull done on the caller's thread (:mod:`pushpull.worker.direct`), or None
        where it needs the engine (first use, several partitions, compression, tracing, GPU tensors,
        one already in flight): the caller then submits it as usual."""
        eng = self.eng
        direct = eng.direct
        e = eng.table.entries.get(name)
        # cheapest tests first; a tensor's shape is a torch.Size (a tuple): compared without a copy
        if (e is None or e.state is not READY or direct is None or direct.closed or eng.cfg.direct_bytes <= 0
                or len(e.parts) != 1 or e.compression is not None or e.parts[0].nbytes > eng.cfg.direct_bytes
                or (e.spec is not spec and e.spec != spec) or spec.op == "concat" or spec.readers is not None
                or eng.pipeline.tracer is not None or tensor.shape != e.shape or eng.member.failure):
            return None
        kind = kind_of(tensor)
        if (not kind.on_host(tensor) or kind.dtype(tensor) is not e.dtype
                or (output is not None and not kind.writable(output))):
            return None
        with eng.table.lock:  # the generation with the change, as the engine's _reset() sets them
            if e.busy or e.state is not READY or eng.changed_unseen:  # a change: the engine's path raises it
                return None
            gen = eng.gen
            e.busy, e.busy_gen = True, gen
        t0 = time.perf_counter()
        try:
            return self._exchange(kind, e, tensor, output, name, average, gen, sig)
        except WorkersChanged:
            eng.changed_unseen = False
            # the new job's rounds of this tensor start from 1 and none has run (it was busy all along): its count
            # is 0 again, whether the change's restart zeroed it before this call counted its round or after
            e.round = 0
            raise
        except PushPullError:
            eng.stats["errors"] += 1
            raise
        finally:
            e.busy = False
            eng.stats["direct_s"] += time.perf_counter() - t0

    def _exchange(self, kind, e: Entry, tensor, output, name: str, average: bool, gen: int, sig: int = 0):
        """The exchange itself, with ``e`` marked busy in generation ``gen``; every way of not getting the sum
        raises."""
        eng = self.eng
        direct = eng.direct
        src = kind.host(tensor)[0]
        out = kind.empty_like(src) if output is None else output
        p = e.parts[0]
        e.round += 1
        # one header per entry, reused: only the sender, round, generation and signature change per call
        header = e.direct_header
        if header is None or header.key != p.key:
            header = e.direct_header = Header(MsgType.PUSH, key=p.key, dtype=e.code, numel=p.nbytes // e.itemsize,
                                              nbytes=p.nbytes, flags=Flags.PULL | Flags.NO_ACK)
        header.sender, header.round, header.gen, header.req_id = eng.rank, e.round, gen, sig
        # the payload: the tensor's own memory (any contiguous NumPy array is a buffer of its bytes)
        payload = kind.payload(src, e.dtype)
        try:
            buf = direct.exchange(p.sock, header, payload, eng.cfg.timeout,
                                  lambda: eng.member.failure or (None if eng.gen == gen else "the workers changed"))
        except TimeoutError:
            why = (f"push_pull of tensor {name!r} did not finish within {eng.cfg.timeout:.0f}s "
                   f"(PUSHPULL_TIMEOUT): {eng.status.missing_ranks(e, [p], e.round)}")
            self._abandon(e, p, e.round, why)
            raise PushPullError(why) from None
        except ConnectionError as ex:
            if eng.gen != gen and not eng.member.failure:
                raise WorkersChanged(f"push_pull of tensor {name!r}: the workers changed (generation {eng.gen}, "
                                     f"{eng.size} workers, this one is rank {eng.rank} now)") from None
            raise PushPullError(f"push_pull of tensor {name!r}: {ex}") from None
        except RuntimeError as ex:  # the server's ERROR: the tensor is unusable, as through the engine
            with eng.table.lock:
                e.state, e.error = FAILED, str(ex)
            raise PushPullError(str(ex)) from None
        except zmq.ZMQError as ex:
            raise PushPullError(f"push_pull of tensor {name!r}: the engine is shut down ({ex})") from None
        out_bytes = kind.raw(out)
        error = eng.averager.copy_sum(e, p, buf, out_bytes, average)
        if error:
            raise PushPullError(error)
        eng.averager.finish(out_bytes, e.dtype, average)
        eng.stats["direct_calls"] += 1
        return out

    def _abandon(self, e: Entry, p, rnd: int, why: str) -> None:
        """The direct path's deadline passed in round ``rnd``: as :meth:`Engine._abandon` for an op."""
        eng = self.eng
        error = eng._unusable(e, rnd, why)
        with eng.table.lock:
            e.state, e.error = FAILED, error
        body = encode_json({"error": f"on rank {eng.rank}, {why} (so round {rnd} fails on every rank)"})
        eng.van.call_soon(lambda: eng.kv.abort(p, rnd, e.code, body))
