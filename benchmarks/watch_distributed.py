#!/usr/bin/env python
"""Cost of ``tl.watch`` on a DDP training step: 2 CPU ranks (gloo, loopback), an MLP
(4 x Linear(512) + ReLU, batch 64 per rank), as ratios against the same DDP step without watch.

Each rank trains three DDP copies on the same batches, steps interleaved (plain, not logged,
logged, ...): ``plain`` (no watch), ``not logged`` (``log_freq=1000``: no collective runs) and
``logged`` (``log_freq=1``, all four kinds: every step's series are agreed, reduced and
written by rank 0 -- 3 collectives per step written, see torchlens/train/measure/distributed.py).
Rank 0 prints the medians and ratios.

    .venv/bin/python benchmarks/watch_distributed.py [--steps 30]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import torchlens as tl


def worker(rank: int, init: str, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    try:
        torch.manual_seed(0)
        layers = []
        for _ in range(4):
            layers += [nn.Linear(512, 512), nn.ReLU()]
        base = nn.Sequential(*layers, nn.Linear(512, 10))
        models = {
            n: nn.parallel.DistributedDataParallel(copy.deepcopy(base)) for n in ("plain", "not logged", "logged")
        }
        opts = {n: torch.optim.SGD(m.parameters(), lr=0.01) for n, m in models.items()}
        run_dir = tempfile.mkdtemp() if rank == 0 else None
        watches = [
            tl.watch(
                models["not logged"], log_freq=1000, run_dir=run_dir and run_dir + "/a", backend=None, verbose=False
            ),
            tl.watch(models["logged"], log_freq=1, run_dir=run_dir and run_dir + "/b", backend=None, verbose=False),
        ]
        g = torch.Generator().manual_seed(rank)
        times: dict = {n: [] for n in models}
        for i in range(steps + 3):
            x, y = torch.randn(64, 512, generator=g), torch.randint(0, 10, (64,), generator=g)
            for name, model in models.items():
                start = time.perf_counter()
                opts[name].zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opts[name].step()
                if i >= 3:
                    times[name].append(time.perf_counter() - start)
        for w in watches:
            w.close()
        if rank == 0:
            plain = statistics.median(times["plain"])
            print(f"DDP, 2 CPU ranks (gloo), MLP 4 x 512, batch 64 per rank, {steps} steps, 1 thread per rank")
            for name, t in times.items():
                print(
                    f"  {name:<11} {statistics.median(t) * 1000:7.1f} ms  {statistics.median(t) / plain:5.2f}x plain DDP"
                )
            print(f"  collectives run by the logged watch: {watches[1]._ranks.collectives} for {steps + 3} steps")
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(
            worker, args=("file://" + os.path.join(d, "init"), args.steps), nprocs=2, start_method="spawn"
        )


if __name__ == "__main__":
    main()
