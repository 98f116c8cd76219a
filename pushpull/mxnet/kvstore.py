"""A KVStore over pushpull for MXNet scripts written against ``mx.kvstore.create("dist_sync")``.

MXNet 1.7+ lets other systems plug in as a ``KVStoreBase`` (its own Horovod and
BytePS stores are such), and Gluon's ``Trainer`` and the Module API use any of
them. ``PushPull`` is registered under the name ``"pushpull"``, so after
``import pushpull.mxnet`` a script switches with one line::

    kv = mx.kvstore.create("dist_sync")          # before
    kv = mx.kvstore.create("pushpull")           # after (or: kv = bps.ScheduledKVStore("dist_sync"))

``ScheduledKVStore(kv)`` is in the spirit of ByteScheduler's wrapper of the
same name: the returned store's pushes go through pushpull's engine, so they
are partitioned and ordered by priority (Gluon passes minus the parameter
index) with the credit window, the same scheduler the PyTorch binding uses.

Semantics are ``dist_sync``'s: ``pushpull`` and ``push`` sum over all workers
(and over the devices of a value list); the type reports ``dist_sync`` so that
Module scales ``rescale_grad`` by the global batch as it does for
``dist_sync``. Not provided: updates on the store (``set_optimizer``; Gluon and
Module then update on the workers, which is equivalent), sparse arrays,
gradient compression through ``set_gradient_compression`` (pass
``compression=`` to pushpull instead).
"""
from __future__ import annotations

import mxnet as mx

from pushpull.mxnet import ops as _ops


def _as_list(v):
    if v is None:
        return None
    return list(v) if isinstance(v, (list, tuple)) else [v]


@mx.kvstore.KVStoreBase.register
class PushPull(mx.kvstore.KVStoreBase):
    """MXNet KVStore backed by pushpull's parameter servers (registered as ``"pushpull"``)."""

    def __init__(self, compression=None, prefix: str = "kv"):
        _ops.init()
        self._compression = compression
        self._prefix = prefix
        self._store: dict = {}      # key -> NDArray: init'ed / last reduced value (push/pull API)
        self._pending: dict = {}    # key -> handle of a push not pulled yet

    def _name(self, key) -> str:
        return f"{self._prefix}.{key}"

    @staticmethod
    def _local_sum(values):
        first = values[0]
        if len(values) == 1:
            return first
        return mx.nd.add_n(*[v.as_in_context(first.context) for v in values])

    # ---------------------------------------------------------------- KVStoreBase --
    def broadcast(self, key, value, out, priority=0):
        """Rank 0's ``value`` into every ``out`` (Gluon calls this to initialise parameters)."""
        if isinstance(key, (list, tuple)):
            for k, v, o in zip(key, value, out):
                self.broadcast(k, v, o, priority)
            return
        src = _as_list(value)[0].copy()
        _ops.broadcast_(src, 0, name=f"{self._name(key)}.init")
        for o in _as_list(out):
            o[:] = src.as_in_context(o.context)

    def pushpull(self, key, value, out=None, priority=0):
        """Sum ``value`` (a list is first summed over its devices) over all workers into ``out``
        (default: ``value``)."""
        if isinstance(key, (list, tuple)):
            outs = out if out is not None else [None] * len(key)
            items = []
            for k, v, o in zip(key, value, outs):
                vs = _as_list(v)
                items.append((self._name(k), priority, self._local_sum(vs), _as_list(o) or vs))
            if _ops.distributed():
                _ops.reduce_many(items, average=False, compression=self._compression)
            else:
                for _, _, src, dst in items:
                    for d in dst:
                        if d is not src:
                            d[:] = src.as_in_context(d.context)
            return
        vs = _as_list(value)
        outs = _as_list(out) or vs
        src = self._local_sum(vs)
        if _ops.distributed():
            _ops.reduce_many([(self._name(key), priority, src, outs)], average=False, compression=self._compression)
        else:
            for d in outs:
                if d is not src:
                    d[:] = src.as_in_context(d.context)

    def set_optimizer(self, optimizer):
        raise NotImplementedError("pushpull's KVStore does not run optimizers on the store: Gluon's Trainer and "
                                  "the Module API then update on the workers (same result, is_capable says so)")

    @staticmethod
    def is_capable(capability):
        return False  # no optimizer on the store: Gluon and Module update locally after pushpull

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError("no optimizer states on the store (they live in the Trainer)")

    def load_optimizer_states(self, fname):
        raise NotImplementedError("no optimizer states on the store (they live in the Trainer)")

    @property
    def type(self):
        return "dist_sync"

    @property
    def rank(self):
        return _ops.rank()

    @property
    def local_rank(self):
        return _ops.local_rank()

    @property
    def num_workers(self):
        return _ops.size()

    # ---------------------------------------------------------------- classic KVStore calls --
    def init(self, key, value):
        """Store rank 0's value under ``key`` on every worker (``dist_sync``: the first init wins)."""
        if isinstance(key, (list, tuple)):
            for k, v in zip(key, value):
                self.init(k, v)
            return
        v = _as_list(value)[0].copy()
        _ops.broadcast_(v, 0, name=f"{self._name(key)}.init")
        self._store[key] = v

    def push(self, key, value, priority=0):
        """Start summing ``value`` over all workers; the next ``pull`` of ``key`` returns the sum
        (``dist_sync`` without an optimizer: the stored value becomes the sum of the pushes)."""
        if isinstance(key, (list, tuple)):
            for k, v in zip(key, value):
                self.push(k, v, priority)
            return
        if key in self._pending:
            self._finish(key)
        src = self._local_sum(_as_list(value))
        if not _ops.distributed():
            self._store[key] = src.copy()
            return
        dst = self._store.get(key)
        if dst is None or dst.shape != src.shape:
            dst = src.copy()
            self._store[key] = dst
        self._pending[key] = _ops.start(src, self._name(key), average=False, priority=priority,
                                        compression=self._compression)

    def _finish(self, key) -> None:
        _ops.finish(self._pending.pop(key), [self._store[key]])

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Write the value stored under ``key`` (after any push in flight) into ``out``."""
        if isinstance(key, (list, tuple)):
            for k, o in zip(key, out):
                self.pull(k, o, priority, ignore_sparse)
            return
        if key in self._pending:
            self._finish(key)
        if key not in self._store:
            raise KeyError(f"pull of key {key!r}: it was never initialised nor pushed")
        for o in _as_list(out):
            o[:] = self._store[key].as_in_context(o.context)

    def set_gradient_compression(self, compression_params):
        raise NotImplementedError("pass compression=pushpull.mxnet.Compression.build(...) to ScheduledKVStore "
                                  "instead of set_gradient_compression")


def ScheduledKVStore(kv="dist_sync", compression=None, prefix: str = "kv") -> PushPull:
    """One-line switch for MXNet scripts (ByteScheduler's ``ScheduledKVStore(kv)``): returns pushpull's
    KVStore in place of ``kv``, a kvstore type name or an MXNet kvstore. Do not create MXNet's own
    ``dist_*`` kvstore first under ``pushpull launch``: it would try to reach MXNet's ps-lite scheduler."""
    kind = kv if isinstance(kv, str) else getattr(kv, "type", "")
    if kind.startswith("dist") and "async" in kind:
        raise NotImplementedError(f"kvstore {kind!r}: asynchronous training is not provided by pushpull")
    return PushPull(compression=compression, prefix=prefix)
