"""examples/kubernetes/pytorchjob.yaml's command under the environment Kubeflow's PyTorchJob operator gives
each pod (MASTER_ADDR, MASTER_PORT, WORLD_SIZE = pods, RANK = pod index), two pods run as plain processes on
this machine: they train the digits example as one pushpull job (torchrun integration)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from pushpull.launch.cli import free_port

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "examples" / "kubernetes" / "pytorchjob.yaml"
yaml = pytest.importorskip("yaml", reason="PyYAML (a dependency of the [bench] extra's transformers) is missing")


def _container() -> dict:
    job = yaml.safe_load(MANIFEST.read_text())
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 2
    return specs["Master"]["template"]["spec"]["containers"][0]


@pytest.fixture(scope="module")
def pods() -> list[str]:
    c = _container()
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_", "SLURM_"))}
    for e in c["env"]:  # the manifest's env; the Secret's value as the operator would resolve it
        base[e["name"]] = e["value"] if "value" in e else "kubernetes-secret-for-the-test"
    base["PROCS_PER_POD"] = "1"  # two pods of one process each on this 2-core machine
    procs = []
    for rank in range(2):
        env = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                   KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_PORT="tcp://10.0.0.1:443")
        procs.append(subprocess.Popen(c["command"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outs)
    return outs


def test_the_two_pods_train_as_one_job(pods):
    final = re.search(r"final: test_accuracy=([\d.]+).*workers=(\d+)", pods[0])
    assert final and int(final.group(2)) == 2, pods[0][-3000:]
    assert float(final.group(1)) >= 0.9, pods[0][-3000:]


def test_the_secret_comes_from_the_manifests_secret():
    env = {e["name"]: e for e in _container()["env"]}
    assert env["PUSHPULL_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "pushpull-secret"
