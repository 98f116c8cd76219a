"""What the elastic test scripts share: a linear model under DistributedOptimizer with its elastic state, its
regression data, one step on a batch and the end's check that every rank holds the same parameters
(elastic_worker.py, elastic_stale_worker.py, torchrun_elastic_worker.py); a hold until a replacement is in
(elastic_worker.py, elastic_stale_worker.py, elastic_sparse_worker.py, diloco_worker.py)."""
import sys
import time

import torch

import pushpull.torch as bps


def elastic_linear(seed: int):
    """(model, optimizer, TorchState with epoch and sizes, x, y): 600 samples of y = x @ w, the same on every rank."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 1)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    state = bps.elastic.TorchState(model, opt, epoch=0, sizes=[])
    g = torch.Generator().manual_seed(0)
    x_all, w_true = torch.randn(600, 8, generator=g), torch.randn(8, 1, generator=g)
    return model, opt, state, x_all, x_all @ w_true


def step(model, opt, x, y) -> None:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def exit_unless_parameters_agree(model, name: str, among: str) -> None:
    """Exit 3, printing the difference, unless every rank holds the same parameters (summed over the ranks)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    total = bps.push_pull(flat.clone(), average=False, name=name)
    if not torch.allclose(total, flat * bps.size(), atol=1e-6):
        print(f"FAIL: parameters differ across {among}: {total - flat * bps.size()}", flush=True)
        sys.exit(3)


def hold_until_generation(gen: int, timeout: float = 60.0) -> None:
    """Sleep, with no operation in flight, until this worker has seen the job's change number ``gen`` (a
    replacement the launcher started came in): the replacement then comes into a running job however long its
    start takes on a loaded machine, where slowed steps all along only made that likely, at the price of their
    sleep. Bounded: past ``timeout`` the worker goes on, and the test's own checks say what did not happen."""
    deadline = time.monotonic() + timeout
    while bps.engine().gen < gen and time.monotonic() < deadline:
        time.sleep(0.02)
