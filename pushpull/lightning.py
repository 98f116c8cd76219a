"""Lightning 2.x on pushpull: ``Trainer(strategy=PushPullStrategy())``.

    import lightning.pytorch as pl
    from pushpull.lightning import PushPullStrategy

    trainer = pl.Trainer(strategy=PushPullStrategy(), accelerator="cpu", devices=1, max_epochs=5)
    trainer.fit(module, datamodule)

and ``pushpull launch --workers N --servers K -- python train.py`` (or srun, mpirun, torchrun:
docs/integrations.md). Each process is one Lightning device; pushpull makes them one job.

Why a strategy of its own (Lightning dropped its Horovod strategy; hivemind ships one as a separate package):
Lightning asks its strategy every question a data-parallel job must answer, so each has one answer here:

* ranks and size: pushpull's (``rank()``, ``size()``, ``local_rank()``), so Lightning shards every
  dataloader with a DistributedSampler and logs only on global rank 0;
* gradients: after each backward pass every gradient is averaged over the workers through the servers (all
  in flight at once), before Lightning clips them and the optimizer steps; with gradient accumulation the
  average of the accumulated gradient is the accumulated average, so every backward pass may average;
* the start: rank 0's parameters are broadcast to every worker in ``setup``;
* ``self.log(..., sync_dist=True)``, ``all_gather``, ``broadcast`` and ``barrier``: pushpull's allreduce,
  allgather, broadcast_object and barrier.
"""
from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.strategies import ParallelStrategy

import pushpull.torch as bps
from pushpull.torch.functions import average_gradients


class PushPullEnvironment(ClusterEnvironment):
    """Ranks from pushpull (which read them from its launcher, torchrun, Slurm or Open MPI)."""

    @property
    def creates_processes_externally(self) -> bool:
        return True  # pushpull launch, srun, mpirun or torchrun started every process

    @property
    def main_address(self) -> str:
        return bps.config().root_uri

    @property
    def main_port(self) -> int:
        return bps.config().root_port

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return bps.size()

    def set_world_size(self, size: int) -> None:
        pass  # pushpull's job decides

    def global_rank(self) -> int:
        return bps.rank()

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return bps.local_rank()

    def node_rank(self) -> int:
        return bps.rank() // max(1, bps.local_size())


class PushPullStrategy(ParallelStrategy):
    """Data parallelism over pushpull's parameter servers (module docstring)."""

    strategy_name = "pushpull"

    def __init__(self, accelerator=None, checkpoint_io=None, precision_plugin=None):
        if not bps.is_initialized():
            bps.init()
        super().__init__(accelerator=accelerator, parallel_devices=[torch.device("cpu")] * bps.size(),
                         cluster_environment=PushPullEnvironment(), checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self.averages = 0  # backward passes whose gradients were averaged (for tests and curiosity)

    @property
    def is_distributed(self) -> bool:
        """Lightning's question for custom strategies: shard every dataloader with a DistributedSampler."""
        return bps.size() > 1

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": bps.size(), "rank": bps.rank()}

    def setup_environment(self) -> None:
        if not bps.is_initialized():
            bps.init()
        super().setup_environment()

    def setup(self, trainer) -> None:
        super().setup(trainer)
        bps.broadcast_parameters(self.model.state_dict(), root_rank=0, prefix="lightning.start.")

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    # -- gradients -------------------------------------------------------------------------------------
    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        if bps.size() == 1:
            return
        average_gradients(self.lightning_module.named_parameters(), "lightning.grad.")
        self.averages += 1

    # -- collectives -------------------------------------------------------------------------------------
    def reduce(self, tensor, group: Any | None = None, reduce_op: Any | None = "mean"):
        if not isinstance(tensor, torch.Tensor) or bps.size() == 1:
            return tensor
        op = str(reduce_op).lower() if reduce_op is not None else "mean"
        if "mean" in op or "avg" in op:
            return bps.allreduce(tensor.detach().float(), op=bps.Average).to(tensor.dtype)
        if "sum" in op:
            return bps.allreduce(tensor.detach(), op=bps.Sum)
        if "max" in op:
            return bps.allreduce(tensor.detach(), op=bps.Max)
        if "min" in op:
            return bps.allreduce(tensor.detach(), op=bps.Min)
        raise ValueError(f"PushPullStrategy.reduce: reduce_op {reduce_op!r} is not mean, sum, max or min")

    def all_gather(self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False) -> torch.Tensor:
        if sync_grads:
            raise NotImplementedError("PushPullStrategy.all_gather(sync_grads=True): the gathered tensor carries no "
                                      "gradient back to the other workers; gather without it")
        if bps.size() == 1:
            return tensor.unsqueeze(0)
        flat = tensor.unsqueeze(0) if tensor.dim() == 0 else tensor
        gathered = bps.allgather(flat.detach().unsqueeze(0) if tensor.dim() > 0 else flat.detach())
        return gathered.view(bps.size(), *tensor.shape)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if bps.size() == 1:
            return obj
        return bps.broadcast_object(obj, root_rank=src)

    def barrier(self, name: str | None = None) -> None:
        if bps.size() > 1:
            bps.barrier()

    def teardown(self) -> None:
        super().teardown()
