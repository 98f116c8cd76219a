"""Hugging Face ``transformers.Trainer`` on pushpull: ``PushPullTrainer`` is the Trainer, data-parallel over
the job's parameter servers.

    import pushpull.torch as bps
    from pushpull.huggingface import PushPullTrainer

    bps.init()
    trainer = PushPullTrainer(model=model, args=TrainingArguments(...), train_dataset=train)
    trainer.train()

and ``pushpull launch --workers N --servers K -- python train.py``, BytePS-style roles (docs/api.md), or torchrun
(``accelerate launch``), srun and mpirun: Accelerate, which Trainer runs on, would read their rank variables and
start torch.distributed's own data parallelism beside pushpull's, so its state is built as a job of one process
(:func:`pushpull.accelerate.accelerate_as_one_process`), also where ``TrainingArguments`` built it before.

Why a subclass and not Trainer's own distributed mode: Trainer's data parallelism is torch.distributed's DDP
(through Accelerate), whose all-reduce runs over gloo or NCCL; here every process is a Trainer of one
process, and what makes them one job is pushpull. Four places change, each where Trainer asks a question
that only the job can answer:

* **gradients**: after each backward pass that ends a gradient-accumulation cycle, every gradient is averaged
  over the workers (push_pull, all in flight at once, through the servers) before Trainer clips it and the
  optimizer steps, so clipping sees the averaged gradient as under DDP;
* **data**: the training sampler is a DistributedSampler over ``size()`` workers at this ``rank()`` (Trainer's
  seed, so each epoch's shuffle agrees);
* **the start**: rank 0's parameters are broadcast before training, so every worker starts alike;
* **who writes**: ``is_world_process_zero()`` is rank 0, so only it logs, and only it saves the model and
  checkpoints (the others hold the same parameters).

Evaluation runs on every worker over the whole evaluation set (each reports the same figures).
"""
from __future__ import annotations

import torch
from accelerate.utils import DistributedType
from torch.utils.data.distributed import DistributedSampler
from transformers import Trainer

import pushpull.torch as bps
from pushpull.accelerate import accelerate_as_one_process
from pushpull.torch.functions import average_gradients


def _as_one_process(training_args) -> None:
    """``TrainingArguments`` set Accelerate up when they were built; under torchrun or mpirun that was a
    torch.distributed job of several processes: set it up again as one (its process group, if it made one,
    stays unused)."""
    state = getattr(training_args, "distributed_state", None)
    if "_setup_devices" in vars(training_args) and state is not None and state.distributed_type != DistributedType.NO:
        del vars(training_args)["_setup_devices"]  # a cached_property: the next read runs it again
        with accelerate_as_one_process():
            training_args._setup_devices


class PushPullTrainer(Trainer):
    """``transformers.Trainer`` whose workers are a pushpull job (module docstring)."""

    def __init__(self, *args, **kwargs):
        if not bps.is_initialized():
            bps.init()
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is not None:
            _as_one_process(training_args)
        with accelerate_as_one_process():
            super().__init__(*args, **kwargs)
        self._pushpull_step = 0

    # -- the start -----------------------------------------------------------------------------------------
    def train(self, *args, **kwargs):
        bps.broadcast_parameters(self.model.state_dict(), root_rank=0, prefix="hf.start.")
        return super().train(*args, **kwargs)

    # -- data ------------------------------------------------------------------------------------------------
    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if bps.size() == 1:
            return super()._get_train_sampler(*([train_dataset] if train_dataset is not None else []))
        return DistributedSampler(dataset, num_replicas=bps.size(), rank=bps.rank(), shuffle=True,
                                  seed=self.args.seed)

    # -- gradients -------------------------------------------------------------------------------------------
    def training_step(self, model, inputs, *args, **kwargs):
        loss = super().training_step(model, inputs, *args, **kwargs)
        if self.accelerator.sync_gradients and bps.size() > 1:
            self._average_gradients(model)
        return loss

    def _average_gradients(self, model: torch.nn.Module) -> None:
        average_gradients(model.named_parameters(), "hf.grad.")
        self._pushpull_step += 1

    # -- who writes --------------------------------------------------------------------------------------------
    def _save(self, *args, **kwargs):
        if bps.rank() == 0:
            return super()._save(*args, **kwargs)
        return None

    def _save_checkpoint(self, *args, **kwargs):
        if bps.rank() == 0:
            return super()._save_checkpoint(*args, **kwargs)
        return None

    def is_world_process_zero(self) -> bool:
        return bps.rank() == 0

    def is_local_process_zero(self) -> bool:
        return bps.local_rank() == 0
