"""Hugging Face Accelerate on pushpull: ``PushPullAccelerator`` is Accelerate's ``Accelerator`` whose processes
are a pushpull job.

    from pushpull.accelerate import PushPullAccelerator

    accelerator = PushPullAccelerator(gradient_accumulation_steps=2)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()

and ``pushpull launch --workers N --servers K -- python train.py``, ``torchrun`` or ``accelerate launch``
(which starts torchrun), ``srun`` or ``mpirun`` (docs/integrations.md).

Why a subclass: Accelerate's data parallelism is torch.distributed's (DDP over gloo or NCCL, started from the
launcher's variables). Here Accelerate's own state is built as a job of one process (the launcher's rank
variables hidden while it is built: :func:`accelerate_as_one_process`), so it starts no process group and wraps
no model in DDP, and is then told the job's ranks and size, so everything that reads them (sharding every
dataloader, ``is_main_process``, saving once, ``split_between_processes``, the scheduler's steps per optimizer
step) answers as under ``accelerate launch``. What torch.distributed did becomes pushpull's:

* **gradients**: each gradient is averaged over the workers through the servers as soon as the backward pass
  has finished it (a hook per parameter, so the reduction overlaps the rest of the backward pass), in the
  backward passes that end a gradient-accumulation cycle (``accumulate()``: the others only accumulate, as
  DDP's ``no_sync``); ``backward()`` returns once every gradient is averaged, so ``clip_grad_norm_`` sees the
  average as under DDP. A parameter without a gradient in that pass pushes zeros, so every worker reduces the
  same tensors;
* **the start**: ``prepare`` broadcasts rank 0's parameters and buffers of every model;
* **data**: each worker takes its share of every batch sampler (Accelerate's own sharding); a shuffling
  ``RandomSampler`` is seeded from rank 0's seed (or ``data_seed``), so the workers agree on each epoch's order
  (another random sampler must be seeded alike on every worker: Accelerate's broadcast of rank 0's generator
  state runs over torch.distributed);
* ``gather``, ``gather_for_metrics``, ``reduce``, ``pad_across_processes``, ``wait_for_everyone``,
  ``main_process_first``: pushpull's allgather, allreduce and barrier; trackers log on rank 0 only.

DeepSpeed, FSDP and Megatron-LM settings are refused (they are torch.distributed's own sharding).
"""
from __future__ import annotations

import contextlib
import os

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, recursively_apply

import pushpull.torch as bps

# the variables Accelerate reads to decide that a launcher started several processes (torchrun / accelerate
# launch, Open MPI, Intel MPI / MPICH, MVAPICH)
_LAUNCHER_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
_LAUNCHER_PREFIXES = ("OMPI_COMM_WORLD_", "PMI_", "MV2_COMM_WORLD_")


@contextlib.contextmanager
def accelerate_as_one_process():
    """While Accelerate's state is built inside this block, it sees no launcher's rank variables, so it takes
    its process for a job of one (no torch.distributed group, no DDP); the variables are back after it.
    pushpull has read them already (``bps.init()`` before this block)."""
    hidden = {k: v for k, v in os.environ.items()
              if k in _LAUNCHER_VARIABLES or k.startswith(_LAUNCHER_PREFIXES)}
    for k in hidden:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(hidden)


def _tell_accelerate_the_job() -> None:
    """Accelerate's state (one process) takes the job's ranks and size, and a GPU per local rank."""
    job = {"num_processes": bps.size(), "process_index": bps.rank(), "local_process_index": bps.local_rank()}
    state = PartialState()
    if state.device is not None and state.device.type == "cuda" and torch.cuda.device_count() > 1:
        job["device"] = torch.device("cuda", bps.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(job["device"])
    for shared in (PartialState._shared_state, AcceleratorState._shared_state):
        if shared:
            shared.update(job)


def _only_tensors(data) -> bool:
    try:
        recursively_apply(lambda x: x, data, error_on_other_type=True)
        return True
    except TypeError:
        return False


class PushPullAccelerator(Accelerator):
    """Accelerate's ``Accelerator`` whose processes are a pushpull job (module docstring). ``compression``:
    the gradients' codec on the wire, as ``DistributedOptimizer``'s (``bps.Compression.fp16``, ...)."""

    def __init__(self, *args, compression=None, **kwargs):
        if not bps.is_initialized():
            bps.init()
        with accelerate_as_one_process():
            super().__init__(*args, **kwargs)
        if self.distributed_type != DistributedType.NO:
            raise ValueError(f"PushPullAccelerator averages gradients through pushpull's servers; Accelerate was "
                             f"configured for {self.distributed_type.value} (a DeepSpeed, FSDP or Megatron-LM "
                             f"setting or plugin), which shards the model over torch.distributed instead")
        if self.dataloader_config.dispatch_batches:
            raise ValueError("PushPullAccelerator: dispatch_batches=True sends rank 0's batches over "
                             "torch.distributed; every worker reads its own share here (leave it False)")
        self.dataloader_config.dispatch_batches = False
        _tell_accelerate_the_job()
        self._compression = compression
        self._grads: dict[int, tuple[str, torch.nn.Parameter]] = {}   # id(param) -> (name on the servers, param)
        self._pending: dict[int, int] = {}                           # id(param) -> handle of this pass
        self._hook_handles: list = []
        self._model_count = 0
        self._no_sync = 0   # depth of no_sync() blocks: their backward passes only accumulate

    # -- who is who ----------------------------------------------------------------------------------------
    @property
    def use_distributed(self) -> bool:
        return bps.size() > 1

    def wait_for_everyone(self) -> None:
        if bps.size() > 1:
            bps.barrier()

    @contextlib.contextmanager
    def main_process_first(self):
        yield from self._goes_first(self.is_main_process)

    @contextlib.contextmanager
    def local_main_process_first(self):
        yield from self._goes_first(self.is_local_main_process)

    def _goes_first(self, first: bool):
        if not first:
            self.wait_for_everyone()
        yield
        if first:
            self.wait_for_everyone()

    # -- the start and the gradients -----------------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module, device_placement=None, evaluation_mode: bool = False):
        model = super().prepare_model(model, device_placement=device_placement, evaluation_mode=evaluation_mode)
        index = self._model_count
        self._model_count += 1
        if bps.size() > 1:
            bps.broadcast_parameters(model.state_dict(), root_rank=0, prefix=f"accelerate.start.{index}.")
            if not evaluation_mode:
                self._track_gradients(model, f"accelerate.grad.{index}.")
        return model

    def _track_gradients(self, model: torch.nn.Module, prefix: str) -> None:
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in self._grads:
                self._grads[id(p)] = (prefix + name, p)
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._on_gradient))

    @contextlib.contextmanager
    def no_sync(self, model):
        """As DDP's ``no_sync``: the backward passes inside only accumulate (``accumulate()`` does it for you)."""
        self._no_sync += 1
        try:
            yield
        finally:
            self._no_sync -= 1

    def _averaging(self) -> bool:
        return self.sync_gradients and self._no_sync == 0 and bps.size() > 1

    def _on_gradient(self, p: torch.nn.Parameter) -> None:
        """The backward pass has finished ``p``'s gradient: start its average if this pass ends a cycle."""
        if not self._averaging() or id(p) not in self._grads:
            return
        name, _ = self._grads[id(p)]
        if id(p) in self._pending:
            raise RuntimeError(f"gradient of {name!r} finished twice in one backward pass of a synchronizing "
                               f"step: call accelerator.backward() once per step, or use accelerator.accumulate()")
        self._start_average(id(p), name, p)

    def _start_average(self, key: int, name: str, p: torch.nn.Parameter) -> None:
        self._pending[key] = bps.push_pull_async_inplace(p.grad, average=True, name=name,
                                                         compression=self._compression)

    def backward(self, loss, **kwargs) -> None:
        try:
            super().backward(loss, **kwargs)
        except BaseException:
            self._drain()
            raise
        if self._averaging():
            self._finish()

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement=None):
        prepared = super().prepare_optimizer(optimizer, device_placement=device_placement)
        # a loop that calls loss.backward() itself still steps on averaged gradients
        self._hook_handles.append(optimizer.register_step_pre_hook(lambda *_: self._finish() if self._pending
                                                                   else None))
        return prepared

    def _finish(self) -> None:
        """Every tracked gradient's average in place: those the backward pass did not reach push zeros (unused
        in this pass), so every worker reduces the same tensors; then wait for all."""
        for key, (name, p) in self._grads.items():
            if key not in self._pending:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._start_average(key, name, p)
        self._drain(raise_errors=True)

    def _drain(self, raise_errors: bool = False) -> None:
        pending, self._pending = self._pending, {}
        error = None
        for handle in pending.values():
            try:
                bps.synchronize(handle)
            except Exception as ex:  # wait for every handle, then raise the first error
                error = error or ex
        if error is not None and raise_errors:
            raise error

    def free_memory(self, *objects):
        for h in self._hook_handles:
            h.remove()
        self._hook_handles, self._grads, self._pending = [], {}, {}
        return super().free_memory(*objects)

    # -- data ------------------------------------------------------------------------------------------------
    def prepare_data_loader(self, data_loader, device_placement=None, slice_fn_for_dispatch=None):
        if bps.size() > 1:
            # every worker walks the same shuffled order and takes its share of it (Accelerate's own way, a
            # broadcast of rank 0's generator state each epoch, runs over torch.distributed)
            self.dataloader_config.use_seedable_sampler = True
            if self.dataloader_config.data_seed is None:
                self.dataloader_config.data_seed = int(bps.broadcast_object(
                    int(torch.initial_seed() % 2**62), root_rank=0, name="accelerate.data_seed"))
        return super().prepare_data_loader(data_loader, device_placement=device_placement,
                                           slice_fn_for_dispatch=slice_fn_for_dispatch)

    # -- collectives ---------------------------------------------------------------------------------------
    def gather(self, tensor):
        """Every worker's tensors concatenated along dimension 0, in rank order (sizes may differ)."""
        if bps.size() == 1:
            return tensor
        # a 0-dim tensor gathers as one row per worker, as Accelerate's gather does
        return recursively_apply(lambda t: bps.allgather((t[None] if t.dim() == 0 else t).contiguous()), tensor,
                                 error_on_other_type=True)

    def reduce(self, tensor, reduction: str = "sum", scale: float = 1.0):
        ops = {"sum": bps.Sum, "mean": bps.Average, "max": bps.Max, "min": bps.Min}
        if reduction == "none":
            return tensor
        if reduction not in ops:
            raise ValueError(f"reduce: reduction {reduction!r} is not one of {sorted(ops) + ['none']}")

        def one(t):
            out = t.clone() if bps.size() == 1 else bps.allreduce(t.contiguous(), op=ops[reduction])
            return out * scale if scale != 1.0 else out
        return recursively_apply(one, tensor, error_on_other_type=True)

    def pad_across_processes(self, tensor, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        if bps.size() == 1:
            return tensor

        def one(t):
            if t.dim() == 0 or dim >= t.dim() or dim < -t.dim():
                return t
            d = dim % t.dim()
            longest = int(bps.allreduce(torch.tensor([t.shape[d]]), op=bps.Max)[0])
            if longest == t.shape[d]:
                return t
            shape = list(t.shape)
            shape[d] = longest
            out = t.new_full(shape, pad_index)
            at = slice(longest - t.shape[d], longest) if pad_first else slice(0, t.shape[d])
            out[(slice(None),) * d + (at,)] = t
            return out
        return recursively_apply(one, tensor, error_on_other_type=True)

    def gather_for_metrics(self, input_data, use_gather_object: bool = False):
        """As Accelerate's: gathered, and the samples the last batch repeated to even the workers out dropped."""
        as_objects = use_gather_object or not _only_tensors(input_data)
        if bps.size() == 1:
            data = input_data
        elif as_objects:
            data = [x for part in bps.allgather_object(input_data) for x in part]
        else:
            data = self.gather(input_data)
        state = self.gradient_state
        if not state.end_of_dataloader or state.remainder <= 0:
            return data
        if as_objects:
            return data[:state.remainder]
        return recursively_apply(lambda t: t[:state.remainder], data)

    # -- trackers: rank 0 only -----------------------------------------------------------------------------
    def init_trackers(self, *args, **kwargs):
        if bps.rank() == 0:
            return super().init_trackers(*args, **kwargs)
        return None

    def log(self, *args, **kwargs):
        if bps.rank() == 0:
            return super().log(*args, **kwargs)
        return None
