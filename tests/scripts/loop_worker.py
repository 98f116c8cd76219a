"""push_pull in a loop until told otherwise; prints READY after the first round.
Used by the liveness test: a frozen server must turn into an error naming it."""
import sys
import time

import torch

import pushpull.torch as bps

bps.init()
x = torch.ones(1000)
bps.push_pull(x, name="loop")
print("READY", flush=True)
t0 = time.monotonic()
while time.monotonic() - t0 < 60:
    try:
        bps.push_pull(x, name="loop")
    except bps.PushPullError as e:
        print(f"LIVENESS-ERROR after {time.monotonic() - t0:.1f}s: {e}", flush=True)
        sys.exit(0)
    time.sleep(0.05)
print("FAIL: no error within 60 s", flush=True)
sys.exit(3)
