"""Worker program for tests/cluster/test_diloco.py: DiLoCo and local SGD (pushpull.torch.DiLoCo) over the
real servers against a reference every rank computes alone: all ranks' inner steps replayed on its own
data, and torch.optim.SGD as the outer optimizer. Prints ``CASE <name> ok`` or ``CASE <name> FAIL <why>``."""
from __future__ import annotations

import sys

import torch
from elastic_common import hold_until_generation

import pushpull.torch as bps

H, ROUNDS, LR = 3, 3, 0.05


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)


FRAGMENTS_OF_THE_MODEL = {1: [[0, 1, 2, 3]], 2: [[0], [1, 2, 3]]}  # by size: weight 30 | 5 + 10 + 2


def reference(n: int, outer: dict, fragments: int = 1, overlap: int = 0, mix: float = 0.5, alive=None,
              total: int = ROUNDS * H, came_in: tuple | None = None, start: list | None = None):
    """Every rank's parameters after ``total`` inner steps and a final sync, and the outer rounds taken,
    computed here alone: all ranks' inner steps replayed, torch.optim.SGD as each fragment's outer optimizer.
    ``alive(step)``: the ranks whose pushes a round at that step averages (default: all). ``came_in=(rank,
    step)``: that rank came into the job after that step's inner steps: it holds the global parameters it has
    received, and takes (not mixes) the answers of the rounds started until then. ``start``: the parameters
    DiLoCo starts from (default: rank 0's initial ones)."""
    alive = alive or (lambda s: list(range(n)))
    frags = FRAGMENTS_OF_THE_MODEL[fragments]
    glob = list(model(0).parameters())  # rank 0's start, which the broadcast gives everyone
    if start is not None:
        with torch.no_grad():
            for g, v in zip(glob, start):
                g.copy_(v)
    outer_opts = [torch.optim.SGD([glob[i] for i in fr], lr=outer["outer_lr"], momentum=outer["outer_momentum"],
                                  nesterov=outer["nesterov"]) for fr in frags]
    locals_ = []
    for _ in range(n):
        m = model(0)
        with torch.no_grad():
            for p, g in zip(m.parameters(), glob):
                p.copy_(g)
        locals_.append(m)
    rounds, inflight = 1, {}
    last = [0] * len(frags)  # the step of each fragment's last round
    received = [g.detach().clone() for g in glob]  # the global parameters as the workers hold them

    def outer_round(f: int, s: int) -> list[torch.Tensor]:
        present = [locals_[w] for w in alive(s)]
        with torch.no_grad():
            for i in frags[f]:
                glob[i].grad = sum(glob[i].detach() - list(m.parameters())[i].detach() for m in present) / len(present)
        outer_opts[f].step()
        return [glob[i].detach().clone() for i in frags[f]]

    def arrive(f: int, new: list[torch.Tensor], merge: bool, started: int = 0, at: int = 0) -> None:
        nonlocal rounds
        rounds += 1
        with torch.no_grad():
            for i, v in zip(frags[f], new):
                received[i].copy_(v)
            for w, m in enumerate(locals_):
                ps = list(m.parameters())
                # the newcomer takes the answers of the rounds open when it came in (it had no drift to mix)
                takes = came_in is not None and w == came_in[0] and started <= came_in[1] <= at
                for i, v in zip(frags[f], new):
                    ps[i].copy_(mix * ps[i] + (1 - mix) * v if merge and not takes else v)

    for s in range(1, total + 1):
        for w, m in enumerate(locals_):
            inner_steps_one(m, w, s - 1)
        if came_in is not None and s == came_in[1]:
            with torch.no_grad():
                for p, g in zip(locals_[came_in[0]].parameters(), received):
                    p.copy_(g)
        for f in [f for f, (due, _, _) in inflight.items() if due <= s]:
            _, new, started = inflight.pop(f)
            arrive(f, new, merge=overlap > 0 and mix > 0, started=started, at=s)
        for f in range(len(frags)):
            off = s - f * H // len(frags)
            if off > 0 and off % H == 0:
                last[f] = s
                new = outer_round(f, s)
                if overlap:
                    inflight[f] = (s + overlap, new, s)
                else:
                    arrive(f, new, merge=False)
    if not inflight and all(s == total for s in last):
        return [[p.detach() for p in m.parameters()] for m in locals_], rounds  # the final sync: nothing to do
    for f in sorted(inflight):  # the final sync: answers in flight first, then every fragment at once
        _, new, started = inflight.pop(f)
        arrive(f, new, merge=overlap > 0 and mix > 0, started=started, at=total + 1)
    news = [outer_round(f, total + 1) for f in range(len(frags))]
    for f, new in enumerate(news):
        arrive(f, new, merge=False)
    rounds -= len(frags) - 1  # the final sync is one round of every fragment
    return [[p.detach() for p in m.parameters()] for m in locals_], rounds


def inner_steps_one(m: torch.nn.Module, rank: int, step: int) -> None:
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    x, y = batch(rank, step)
    opt.zero_grad()
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.step()


def train(m: torch.nn.Module, opt, rank: int, die_at: int | None = None) -> None:
    """ROUNDS * H inner steps on ``rank``'s batches (SIGKILLed before step ``die_at``), then a final sync."""
    import os
    import signal

    for s in range(ROUNDS * H):
        if s == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(rank, s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    opt.sync()


def run(outer: dict, name: str, **streaming) -> None:
    rank, n = bps.rank(), bps.size()
    m = model(rank)  # every rank starts elsewhere: DiLoCo's start must give them rank 0's parameters
    opt = bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(), sync_every=H, name=name,
                     **outer, **streaming)
    train(m, opt, rank)
    want, rounds = reference(n, outer, **streaming)
    got = [p.detach() for p in m.parameters()]
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want[rank]))
    if opt.rounds != rounds:
        print(f"CASE {name} FAIL rank {rank}: {opt.rounds} rounds, {rounds} due", flush=True)
    elif worst > 1e-5:
        print(f"CASE {name} FAIL rank {rank}: parameters differ from the reference by {worst:.3g}", flush=True)
    else:
        print(f"CASE {name} ok rank {rank} (max difference {worst:.1e})", flush=True)


DILOCO = {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}
CASES = {"diloco": (DILOCO, {}),
         "localsgd": ({"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}, {}),
         "momentum": ({"outer_lr": 0.5, "outer_momentum": 0.8, "nesterov": False}, {}),
         "streaming": (DILOCO, {"fragments": 2}),
         "streaming-overlap": (DILOCO, {"fragments": 2, "overlap": 1, "mix": 0.5})}


def churn() -> None:
    """3 workers, --min-workers 2: the worker that started as rank 2 is SIGKILLed after its 7th inner step
    (between the outer rounds of steps 6 and 9). The other two go on without a restore: the round of step 9
    and every later one average their two pushes, and both end with the reference's parameters."""
    rank, n = bps.rank(), bps.size()
    m = model(rank)
    opt = bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(), sync_every=H, name="churn",
                     **DILOCO)
    train(m, opt, rank, die_at=7 if rank == 2 else None)  # the rank it started with: its shard
    want, rounds = reference(n, DILOCO, alive=lambda s: [0, 1, 2] if s <= 7 else [0, 1])
    worst = max(float((a - b).abs().max()) for a, b in zip(m.parameters(), want[rank]))
    ok = bps.size() == 2 and opt.changes >= 1 and opt.rounds == rounds and worst < 1e-5
    print(f"CASE churn {'ok' if ok else 'FAIL'} rank {rank} -> {bps.rank()} of {bps.size()}: {opt.changes} "
          f"change(s) taken, {opt.rounds} rounds ({rounds} due), {worst:.1e} from the reference", flush=True)


JOIN_STEPS, JOIN_DIE_AT = 30, 8  # nothing in flight after step 8 in either configuration
JOIN_CONFIGS = {"diloco": {}, "streaming-overlap": {"fragments": 2, "overlap": 1, "mix": 0.5}}


def join(config: str) -> None:
    """3 workers, --min-workers 2 --restart-workers 1: the worker started as rank 2 is SIGKILLed after its 8th
    inner step; the launcher starts it again, and it comes into the running job as rank 2 where the others
    are (DiLoCo's welcome). It counts from its first round after coming in; before that, the rounds average
    the two others. All three end with the reference's parameters, which replays exactly that, and with the
    same step and round counts. Once the loss is seen (the job's first change) the others hold until the newcomer
    is in (its second), so that it comes in mid-run however long its start takes."""
    import os
    import signal

    streaming = JOIN_CONFIGS[config]
    rank = bps.rank()
    m = model(rank)
    opt = bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(), sync_every=H,
                     name=f"join-{config}", **DILOCO, **streaming)
    newcomer = opt.joined_at is not None
    while opt.steps < JOIN_STEPS:
        if not newcomer and bps.engine().gen == 1:
            hold_until_generation(2)
        if opt.steps == JOIN_DIE_AT and rank == 2 and not newcomer:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(rank, opt.steps)  # the job's step: a newcomer's batches are those the reference replays
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    opt.sync()
    n = bps.size()
    came = bps.broadcast_object(opt.joined_at, root_rank=n - 1, name="join.came_in")
    if n != 3 or came is None:
        print(f"CASE join FAIL rank {bps.rank()}: no newcomer came in ({n} workers)", flush=True)
        return
    want, rounds = reference(3, DILOCO, **streaming, total=JOIN_STEPS, came_in=(2, came),
                             alive=lambda s: [0, 1, 2] if s <= JOIN_DIE_AT or s > came else [0, 1])
    worst = max(float((a.detach() - b).abs().max()) for a, b in zip(m.parameters(), want[bps.rank()]))
    ok = opt.rounds == rounds and worst < 1e-5 and opt.steps == JOIN_STEPS
    print(f"CASE join {'ok' if ok else 'FAIL'} rank {bps.rank()} of {n} ({'newcomer at step ' + str(came) if newcomer else f'welcomed {opt.welcomed}'}): "
          f"{opt.rounds} rounds ({rounds} due), {worst:.1e} from the reference", flush=True)


SERVER_LOSS_AT = 4  # after the round of step 3 (the first with momentum), before that of step 6
SERVER_BACK_STEPS = 24  # with --restart-servers: the loss seen, every rank holds until the replacement is in


def server_loss(config: str, replaced: bool = False) -> None:
    """3 workers over 2 servers, --min-workers 2: after its 4th inner step rank 0 SIGKILLs a server, then
    stalls 2 s, so that the others' round of step 6 goes to the dead server (and fails) while rank 0 comes
    to it after the change. The lost server's outer keys move to the other, which starts them from the
    workers' seed (the global parameters and the momentum they inferred), so every round still averages all
    three and all ranks end within 1e-5 of the undisturbed reference. Without the seed the round of step 6
    fails on the moved keys; with the momentum lost the result is off by far more than 1e-5. ``replaced``
    (--restart-servers 1): the launcher starts the server again and it takes the lost one's place; the
    outer keys stay on the survivor, where their state is exact (the plain keys go back), and the job goes
    on; the run is longer, and once the loss is seen every rank holds until the replacement is in, so that it comes
    in mid-run."""
    import time

    from pushpull.bench.victims import kill_a_server

    streaming = JOIN_CONFIGS[config]
    rank = bps.rank()
    m = model(rank)
    name = f"loss-{config}"
    opt = bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(), sync_every=H, name=name,
                     **DILOCO, **streaming)
    eng = bps.engine()

    def servers() -> set:
        return {p.server for n, e in eng.table.entries.items() if n.startswith(name + ".") for p in e.parts}
    held = servers()
    total = SERVER_BACK_STEPS if replaced else ROUNDS * H
    for s in range(total):
        if replaced and eng.gen == 1:
            hold_until_generation(2)
        if s == SERVER_LOSS_AT and rank == 0:
            kill_a_server(bps.config().root_port)
            time.sleep(2.0)
        x, y = batch(rank, s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    opt.sync()
    want, rounds = reference(3, DILOCO, **streaming, total=total)
    worst = max(float((a.detach() - b).abs().max()) for a, b in zip(m.parameters(), want[rank]))
    lost = sorted(eng.servers_lost)
    # the loss, then the replacement, which the outer keys do not move to (their state is exact where it is)
    back = len(servers()) == 1 and not lost and eng.gen == 2
    ok = (held == {0, 1} and (back if replaced else len(lost) == 1) and bps.size() == 3 and opt.rounds == rounds
          and worst < 1e-5)
    print(f"CASE loss {'ok' if ok else 'FAIL'} rank {rank}: keys on servers {sorted(held)}, now {sorted(servers())}, "
          f"server(s) {lost} lost, generation {eng.gen}, {bps.size()} workers, {opt.rounds} rounds ({rounds} due), "
          f"{worst:.1e} from the reference", flush=True)


def main() -> None:
    bps.init()
    if sys.argv[1:2] == ["loss"]:
        server_loss(sys.argv[2], replaced=sys.argv[3:4] == ["replaced"])
        bps.shutdown()
        print("ALL-DONE", flush=True)
        return
    if sys.argv[1:2] in (["churn"], ["join"]):
        churn() if sys.argv[1] == "churn" else join(sys.argv[2])
        bps.shutdown()
        print("ALL-DONE", flush=True)
        return
    for name, (outer, streaming) in CASES.items():
        try:
            run(outer, name, **streaming)
        except Exception as e:  # noqa: BLE001 - reported as the case's failure
            print(f"CASE {name} FAIL rank {bps.rank()}: {type(e).__name__}: {e}", flush=True)
    try:
        after_synchronous_start()
    except Exception as e:  # noqa: BLE001 - reported as the case's failure
        print(f"CASE after_sync FAIL rank {bps.rank()}: {type(e).__name__}: {e}", flush=True)
    if bps.size() > 1:
        disagree()
        compressed()
    bps.shutdown()
    print("ALL-DONE", flush=True)


def disagree() -> None:
    """Ranks that give different outer settings fail at the start, on every rank, naming the setting."""
    rank = bps.rank()
    m = model(0)
    try:
        bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(), sync_every=H, name="disagree",
                   outer_lr=0.7 if rank == 0 else 0.5)
    except bps.PushPullError as e:
        ok = "outer_lr" in str(e) and "differs across workers" in str(e)
        print(f"CASE disagree {'ok' if ok else 'FAIL'} rank {rank}: {e}", flush=True)
    else:
        print(f"CASE disagree FAIL rank {rank}: no error", flush=True)




SYNC_STEPS = 2


def after_synchronous_start() -> None:
    """A synchronous start, then DiLoCo (post-local SGD): SYNC_STEPS steps of DistributedOptimizer, its
    remove_hooks(), and DiLoCo over the same inner optimizer: every rank ends with the parameters of a reference
    that replays the synchronous steps (the ranks' mean gradient) and then DiLoCo's rounds from there. Without
    remove_hooks() the hooks would go on reducing every gradient (here the second inner backward fails)."""
    rank, n = bps.rank(), bps.size()
    m = model(rank)
    inner = torch.optim.SGD(m.parameters(), lr=LR)
    # built on the inner optimizer before wrapping: the second synchronous step runs at half the rate (a wrapper
    # that copied the param groups would keep the first rate), DiLoCo's at LR again
    rate = [1.0, 0.5] + [1.0] * (ROUNDS * H + 1)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: rate[s])
    bps.broadcast_parameters(m.state_dict(), root_rank=0)
    sync = bps.DistributedOptimizer(inner, named_parameters=[(f"warm.{k}", v) for k, v in m.named_parameters()])
    for s in range(SYNC_STEPS):
        x, y = batch(rank, 100 + s)  # batches of their own: DiLoCo's steps below use batch(rank, 0...)
        sync.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        sync.step()
        sched.step()
    sync.remove_hooks()
    opt = bps.DiLoCo(inner, m.named_parameters(), sync_every=H, name="after_sync", **DILOCO)
    train(m, opt, rank)
    ref = model(0)
    for s in range(SYNC_STEPS):
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for k in range(n):
            ref.zero_grad()
            x, y = batch(k, 100 + s)
            torch.nn.functional.mse_loss(ref(x), y).backward()
            for g, p in zip(grads, ref.parameters()):
                g += p.grad / n
        with torch.no_grad():
            for g, p in zip(grads, ref.parameters()):
                p -= LR * rate[s] * g
    want, rounds = reference(n, DILOCO, start=[p.detach() for p in ref.parameters()])
    worst = max(float((a - b).abs().max()) for a, b in zip(m.parameters(), want[rank]))
    ok = worst < 1e-5 and opt.rounds == rounds
    print(f"CASE after_sync {'ok' if ok else 'FAIL'} rank {rank}: {worst:.1e} from the reference, {opt.rounds} "
          f"rounds ({rounds} due)", flush=True)


def compressed() -> None:
    """int8 pseudo-gradients (per-block scales) on the way up, the global parameters whole on the way down:
    every rank ends with the same parameters, near the uncompressed reference (one int8 step of each
    block's largest pseudo-gradient element, per round)."""
    rank, n = bps.rank(), bps.size()
    m = model(rank)
    opt = bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(), sync_every=H, name="int8",
                     compression=bps.Compression.build("int8", block=8, min_compress_bytes=0), **DILOCO)
    train(m, opt, rank)
    want, _ = reference(n, DILOCO)
    flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    everyone = bps.allgather(flat.unsqueeze(0), name="int8.check")
    off = max(float((a - b).abs().max()) for a, b in zip(m.parameters(), want[rank]))
    same = bool(torch.equal(everyone.min(0).values, everyone.max(0).values))
    ok = same and 1e-6 < off < 0.05  # compressed (not the reference exactly), and close to it
    print(f"CASE int8 {'ok' if ok else 'FAIL'} rank {rank}: ranks agree {same}, {off:.2g} from the uncompressed "
          f"reference", flush=True)


if __name__ == "__main__":
    main()
