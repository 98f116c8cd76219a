"""One worker of a Hugging Face Accelerate training loop on pushpull (pushpull.accelerate.PushPullAccelerator),
started by pushpull launch or torchrun: a small regression net, a shuffled loader, gradient accumulation, clipping,
a learning-rate schedule, a parameter the forward pass never uses, and an evaluation set whose length is no
multiple of the workers' batch. Rank 0 then replays the same training in one process from the same sample order
(the global batch's mean gradient, no pushpull) and compares parameters. Prints one JSON line per rank:
``ACCELERATE {...}``."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, Dataset

from pushpull.accelerate import PushPullAccelerator
import pushpull.torch as bps

N_TRAIN, N_EVAL, BATCH, ACCUM, EPOCHS, LR, CLIP = 96, 13, 4, 2, 2, 0.05, 0.5


class Indexed(Dataset):
    """(index, x, y): the index tells which samples each worker saw."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.spare = torch.nn.Linear(4, 4)  # never used in forward: its gradient is None on every worker

    def forward(self, x):
        return self.body(x)


def build(seed_offset: int):
    torch.manual_seed(1234 + seed_offset)  # ranks start apart: prepare() must broadcast rank 0's parameters
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.02 * s))
    return model, opt, sched


def replay(start: dict, seed: int, size: int) -> dict:
    """The same training in one process: each optimizer step the mean of size x ACCUM consecutive batches' mean
    gradients (the workers' shares of the shuffled order), clipped, then the schedule stepped size times (as
    Accelerate does for a job of size processes)."""
    from accelerate.data_loader import SeedableRandomSampler

    model, opt, sched = build(0)
    model.load_state_dict(start)
    train = Indexed(N_TRAIN, 0)
    sampler = SeedableRandomSampler(train, data_seed=seed)
    for _ in range(EPOCHS):
        batches = list(BatchSampler(sampler, BATCH, drop_last=False))
        per_step = size * ACCUM
        for k in range(0, len(batches) - per_step + 1, per_step):
            opt.zero_grad()
            for b in batches[k:k + per_step]:
                _, x, y = train[torch.tensor(b)]
                (torch.nn.functional.mse_loss(model(x), y) / per_step).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            for _ in range(size):
                sched.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def main() -> None:
    bps.init()
    rank, size = bps.rank(), bps.size()
    accelerator = PushPullAccelerator(gradient_accumulation_steps=ACCUM)
    model, opt, sched = build(rank)
    train = DataLoader(Indexed(N_TRAIN, 0), batch_size=BATCH, shuffle=True)
    held = DataLoader(Indexed(N_EVAL, 1), batch_size=BATCH)
    model, opt, train, held, sched = accelerator.prepare(model, opt, train, held, sched)
    start = {k: v.clone() for k, v in model.state_dict().items()}

    seen: list[list[int]] = []
    losses = []
    for _ in range(EPOCHS):
        seen.append([])
        for idx, x, y in train:
            seen[-1] += idx.tolist()
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), CLIP)
                opt.step()
                sched.step()
                opt.zero_grad()
            losses.append(loss.item())

    model.eval()
    gathered_idx, preds = [], []
    with torch.no_grad():
        for idx, x, _ in held:
            gi, gp = accelerator.gather_for_metrics((idx, model(x)))
            gathered_idx += gi.tolist()
            preds.append(gp)
    objects = accelerator.gather_for_metrics([f"rank{rank}"])
    total = accelerator.reduce(torch.tensor([float(rank + 1)]), reduction="sum")
    scalars = accelerator.gather(torch.tensor(float(rank)))
    padded = accelerator.pad_across_processes(torch.ones(rank + 1), dim=0)
    accelerator.wait_for_everyone()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"written_by_{rank}.pt"
        accelerator.save({"rank": rank}, path)
        wrote = path.exists()

    result = {
        "rank": rank, "size": size, "process_index": accelerator.process_index,
        "num_processes": accelerator.num_processes, "is_main": accelerator.is_main_process,
        "torch_distributed": dist.is_available() and dist.is_initialized(),
        "seen": seen, "first_loss": sum(losses[:4]) / 4, "last_loss": sum(losses[-4:]) / 4,
        "eval_indices": gathered_idx, "objects": objects, "reduced": total.tolist(), "scalars": scalars.tolist(),
        "padded": padded.tolist(), "wrote": wrote, "lr": sched.get_last_lr()[0],
        "params": [round(float(v.double().sum()), 6) for v in model.state_dict().values()],
    }
    if rank == 0:
        expect = replay(start, accelerator.dataloader_config.data_seed, size)
        got = model.state_dict()
        result["replay_max_diff"] = max(float((got[k] - expect[k]).abs().max()) for k in expect)
        result["spare_unchanged"] = bool(torch.equal(got["spare.weight"], start["spare.weight"]))
    print("ACCELERATE " + json.dumps(result), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    sys.exit(main())
