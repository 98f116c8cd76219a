"""MXNet binding, Horovod/BytePS-shaped: ``import pushpull.mxnet as bps``.

Gluon's ``DistributedTrainer``, a KVStore registered as ``"pushpull"`` (with
``ScheduledKVStore`` for a one-line switch from ``dist_sync``), and the
collectives; same engine, servers and wire format as :mod:`pushpull.torch`.
Needs ``mxnet`` 1.9.1, which needs NumPy < 1.24 and so an environment of its
own (``pip install "pushpull[mxnet]"``; scripts/test-mxnet.sh makes one).
"""
from pushpull.mxnet.ops import (  # noqa: F401
    Compression, allreduce, allreduce_, barrier, broadcast, broadcast_, broadcast_object, broadcast_parameters,
    byteps_declare_tensor, byteps_push_pull, distributed, init, is_initialized, local_rank, local_size, push_pull,
    rank, shutdown, size,
)
from pushpull.mxnet.trainer import DistributedOptimizer, DistributedTrainer  # noqa: F401
from pushpull.mxnet.kvstore import PushPull, ScheduledKVStore  # noqa: F401
from pushpull.worker.broadcast import BroadcastError  # noqa: F401
from pushpull.worker.handle import PushPullError  # noqa: F401
