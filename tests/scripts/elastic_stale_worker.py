"""Keys that only part of the job declared, moved with a lost server (the chaos run's third failure, issue 30).

Under ``pushpull launch --workers 3 --servers 2 --min-workers 2 --restart-workers 1 --restart-servers 1``: the
worker started as rank 1 kills itself in epoch 1; at size 2 every step also sums four keys whose names hold the
size (as elastic.run's own agreement keys do), which the replacement, once in, never uses. Rank 0 then kills a
server: those keys move with its partitions (and back to its replacement). Longer than PUSHPULL_TIMEOUT later the
replacement worker kills itself, and the two left use the size-2 keys again: their sums must be exact. Before a
change's declarations waited for their next use, the survivors declared the moved keys at once, the servers
waited for the replacement's declaration too, and at the timeout failed the keys for their next use."""
import os
import re
import signal
import sys
import time

import torch
from elastic_common import elastic_linear, exit_unless_parameters_agree, hold_until_generation, step as one_step

import pushpull.torch as bps
from pushpull.bench.victims import kill_a_server

bps.init()
late = bps.engine().joined_late
first_rank = bps.engine().first_rank
print(f"START first rank {first_rank} rank {bps.rank()} size {bps.size()} late {late}", flush=True)
model, opt, state, x_all, y_all = elastic_linear(first_rank)
done = {"server": False, "stale_sums": 0, "server_back_at": None}
TIMEOUT = float(bps.config().timeout)


def kill_stale_keys_server() -> None:
    """SIGKILL the server that holds the first size-2 key (found by its Unix socket's name, which holds its pid;
    any server where the servers have none)."""
    eng = bps.engine()
    server = eng.table.entries["allreduce.stale0.n2"].parts[0].server
    pid = re.search(r"pushpull-server-(\d+)-", eng.server_addrs[f"s{server}"])
    if pid is None:
        kill_a_server(bps.config().root_port)
        return
    print(f"VICTIM server {server} (pid {pid.group(1)}), which holds stale0.n2, dies now", flush=True)
    os.kill(int(pid.group(1)), signal.SIGKILL)


@bps.elastic.run
def train(state):
    while state.epoch < 11:
        rank, size = bps.rank(), bps.size()
        state.sizes = state.sizes + [size]
        idx = torch.arange(rank, 600, size)
        for step in range(10):
            gen = bps.engine().gen  # the changes: 1 worker lost, 2 its replacement in, 3 a server lost, 4 it is back
            if gen == 1 and done["stale_sums"]:
                hold_until_generation(2)  # the size-2 keys are declared: now let the replacement in
            if gen == 3:
                hold_until_generation(4)
            if gen == 4 and done["server_back_at"] is None:
                done["server_back_at"] = time.monotonic()
            if gen == 4 and state.epoch >= 8 and step == 4:
                # every rank (they step together) waits out PUSHPULL_TIMEOUT from the move before the replacement
                # dies, as the chaos run's job did: the moved keys' declarations are older than one deadline
                time.sleep(max(0.0, done["server_back_at"] + TIMEOUT + 1.0 - time.monotonic()))
            if first_rank == 1 and not late and state.epoch == 1 and step == 4:
                print("VICTIM worker dies now", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if first_rank == 0 and size == 3 and state.epoch >= 4 and not done["server"]:
                done["server"] = True
                kill_stale_keys_server()
            if late and size == 3 and state.epoch >= 8 and step == 4:
                print("VICTIM replacement worker dies now", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if size == 2:  # keys of this size only: the replacement never declares them
                for i in range(4):
                    got = bps.push_pull(torch.ones(4), average=False, name=f"stale{i}.n{size}")
                    if not torch.equal(got, torch.full((4,), float(size))):
                        print(f"FAIL: stale{i}.n{size} summed to {got.tolist()}", flush=True)
                        sys.exit(3)
                    done["stale_sums"] += 1
            b = idx[step * 20:(step + 1) * 20]
            one_step(model, opt, x_all[b], y_all[b])
        state.epoch += 1
        state.commit()


train(state)
exit_unless_parameters_agree(model, "stale.check", "the workers")
print(f"STALE rank {first_rank}->{bps.rank()} size {bps.size()} sizes {state.sizes} stale sums {done['stale_sums']} "
      f"late {late}", flush=True)
bps.shutdown()
print("ALL-OK", flush=True)
