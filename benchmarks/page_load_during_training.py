#!/usr/bin/env python
"""Cost of explorer clients on a training step, as ratios against the step with no client.

A ResNet-18 (batch 8, 64x64, SGD) trains under ``tl.watch``; its steps are timed in three
phases: no client, ``--clients`` client processes fetching the run's JSON routes (``/api/poll``,
``/api/run``, ``/api/call_series``, ``/api/runs``) in a loop as fast as they can, no client
again. The ratio is the median step with clients over the median step without (both phases).
A probe process loads the page (``/`` and ``/api/poll``) every 0.5 s meanwhile: its slowest
answer says whether the page stays live (target 2 s). Target ratio: <= 1.1.

Two ways of serving are measured, each in a run of its own:

* ``process`` -- what ``tl.watch`` does: the server runs in a process of its own;
* ``thread``  -- the server in a thread of the training process (what it did before), for
                 comparison.

The clients run at the lowest CPU priority (``--client-nice``), so that on a small machine the
measure is of what the server costs training, not of the clients' own CPU use (on a machine
with spare cores it makes no difference). Torch runs on one thread.

    .venv/bin/python benchmarks/page_load_during_training.py [--steps 20] [--clients 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

import torch
from torch import nn

import torchlens as tl
from torchlens.train.serve import explore

CLIENT = r"""
import http.client, json, os, select, sys, time
port, mode, call, nice = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
os.nice(nice)
paths = ["/api/poll?since=-1", "/api/run", "/api/call_series?call=" + call, "/api/runs"]

def get(path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 200, (path, response.status)

get("/api/runs")
print("go", flush=True)
n, worst = 0, 0.0
while not select.select([sys.stdin], [], [], 0)[0]:
    if mode == "probe":
        t = time.perf_counter()
        get("/")
        get("/api/poll?since=-1")
        worst = max(worst, time.perf_counter() - t)
        time.sleep(0.5)
    else:
        get(paths[n % len(paths)])
    n += 1
print(json.dumps({"requests": n, "worst_s": worst}), flush=True)
"""


def resnet18():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return model, step


def timed(step: Callable[[], None], n: int) -> List[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def start_clients(port: int, n: int, nice: int) -> List[subprocess.Popen]:
    clients = []
    for mode in ["probe"] + ["poll"] * n:
        clients.append(
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, str(port), mode, "conv1:1", str(nice)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for c in clients:  # every client has had an answer: they are all polling now
        assert c.stdout.readline().strip() == "go"
    return clients


def stop_clients(clients: List[subprocess.Popen]) -> List[dict]:
    for c in clients:
        c.stdin.write("stop\n")
        c.stdin.flush()
    results = [json.loads(c.stdout.readline()) for c in clients]
    for c in clients:
        c.wait(timeout=60)
    return results


def measure(mode: str, args: argparse.Namespace, folder: str) -> Dict[str, float]:
    model, step = resnet18()
    run_dir = f"{folder}/{mode}"
    in_process = None
    if mode == "process":
        w = tl.watch(model, run_dir=run_dir, port=0, log_freq=args.log_freq, verbose=False)
        port = int(w.url.rsplit(":", 1)[1])
    else:
        w = tl.watch(model, run_dir=run_dir, backend=None, log_freq=args.log_freq, verbose=False)
        in_process = explore(run_dir, port=0, block=False)
        port = in_process.port
    try:
        timed(step, args.warmup)
        w.flush()
        if mode == "process":
            assert w._server.wait_ready(timeout=120), "the serving process did not start"
        quiet = timed(step, args.steps)
        clients = start_clients(port, args.clients, args.client_nice)
        elapsed = time.perf_counter()
        busy = timed(step, args.steps)
        elapsed = time.perf_counter() - elapsed
        results = stop_clients(clients)
        quiet += timed(step, args.steps)
    finally:
        w.close()
        if in_process is not None:
            in_process.close()
    plain = statistics.median(quiet)
    return {
        "step ms": plain * 1000,
        "with clients ms": statistics.median(busy) * 1000,
        "ratio": statistics.median(busy) / plain,
        "requests/s": sum(r["requests"] for r in results[1:]) / elapsed,
        "page worst s": results[0]["worst_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per phase")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--log-freq", type=int, default=5)
    parser.add_argument("--client-nice", type=int, default=19)
    parser.add_argument("--modes", default="process,thread")
    parser.add_argument("--quick", action="store_true", help="few steps (a smoke run on a shared machine)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup = 8, 3
    torch.set_num_threads(1)
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for mode in args.modes.split(","):
            rows[mode] = measure(mode, args, folder)
    keys = ["step ms", "with clients ms", "ratio", "requests/s", "page worst s"]
    print(f"ResNet-18, batch 8, 64x64, {args.clients} clients, {args.steps} steps per phase")
    print(f"{'server':10s}" + "".join(f"{k:>17s}" for k in keys))
    for mode, row in rows.items():
        print(f"{mode:10s}" + "".join(f"{row[k]:17.2f}" for k in keys))


if __name__ == "__main__":
    main()
