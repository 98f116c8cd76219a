"""PUSHPULL_METRICS_PORT under the launcher: train a few steps, then read this worker's and server 0's
Prometheus endpoints (real HTTP on loopback) and print each figure as ``METRIC <rank> <name> <value>``."""
import os
import urllib.request

import torch

import pushpull.torch as bps

bps.init()
port = int(os.environ["PUSHPULL_METRICS_PORT"])
first = bps.engine().first_rank
model = torch.nn.Linear(64, 8)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
for _ in range(6):  # the figures read below count these
    opt.zero_grad()
    model(torch.randn(16, 64)).pow(2).mean().backward()
    opt.step()
bps.barrier()
from prometheus_client.openmetrics.parser import text_string_to_metric_families  # noqa: E402

for who, p in (("worker", port + first), ("server", port + 500)):
    # Prometheus asks for OpenMetrics by default: its own parser must take what we serve
    req = urllib.request.Request(f"http://127.0.0.1:{p}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    families = list(text_string_to_metric_families(urllib.request.urlopen(req, timeout=10).read().decode()))
    print(f"OPENMETRICS {first} {who} {len(families)} families", flush=True)
    text = urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("pushpull_"):
            name, value = line.split("{")[0], line.rsplit(" ", 1)[1]
            print(f"METRIC {first} {who} {name} {value}", flush=True)
bps.barrier()
# pushpull top while the job trains: rank 0 starts it, both train on for about three seconds
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

top = None
if first == 0:
    top = subprocess.Popen([sys.executable, "-m", "pushpull", "top", "--port", str(port), "--once", "--interval",
                            "1.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
for _ in range(30):
    opt.zero_grad()
    model(torch.randn(16, 64)).pow(2).mean().backward()
    opt.step()
    time.sleep(0.1)
if top is not None:
    print("TOP-BEGIN\n" + top.communicate(timeout=30)[0] + "TOP-END", flush=True)
bps.barrier()
bps.shutdown()
print("ALL-OK", flush=True)
