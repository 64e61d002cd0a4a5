#!/usr/bin/env python
"""Cost of the NaN sentinel's per-step agreement under DDP (two gloo ranks on loopback, CPU), as
ratios against a plain DDP training step measured in the same run.

Three identical DDP copies of an MLP train on the same batches, their steps interleaved (plain,
watched, watched + sentinel, ...) so that all three see the same machine:

* ``plain``     -- forward, backward, SGD step, no watch;
* ``watched``   -- ``tl.watch(log_freq=10**9)``: after the first, no step is logged (no collective);
* ``sentinel``  -- the same with ``on_nonfinite="raise"``: every step checks outputs and
                   gradients and runs the ranks' ``all_reduce(MIN)`` of one number that decides
                   together (the time inside that agreement is printed on its own).

Also printed: one bare ``all_reduce`` of one int64 (the agreement's collective alone). Medians of
per-step times on rank 0.

    .venv/bin/python benchmarks/sentinel_ddp_overhead.py [--steps 60] [--width 256] [--batch 32]
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


def _worker(rank: int, world: int, init: str, args: argparse.Namespace) -> None:
    import torchlens as tl

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    try:
        torch.manual_seed(0)
        w = args.width
        net = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
        models = {
            name: nn.parallel.DistributedDataParallel(copy.deepcopy(net)) for name in ("plain", "watched", "sentinel")
        }
        opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in models.items()}
        d = tempfile.mkdtemp()
        watches = [
            tl.watch(models["watched"], run_dir=os.path.join(d, "w"), backend=None, verbose=False, log_freq=10**9),
            tl.watch(
                models["sentinel"],
                run_dir=os.path.join(d, "s"),
                backend=None,
                verbose=False,
                log_freq=10**9,
                on_nonfinite="raise",
            ),
        ]
        times: dict = {name: [] for name in models}
        agree: list = []  # time inside the ranks' agreement (the all_reduce and its read)
        ranks = watches[1]._ranks
        decide = ranks.first_nonfinite

        def timed(*a: object) -> object:
            t0 = time.perf_counter()
            try:
                return decide(*a)
            finally:
                agree.append(time.perf_counter() - t0)

        ranks.first_nonfinite = timed
        x = torch.randn(args.batch, w)
        for step in range(args.steps + 5):
            for name, model in models.items():
                dist.barrier()
                t0 = time.perf_counter()
                model(x).square().mean().backward()
                opts[name].step()
                opts[name].zero_grad(set_to_none=True)
                if step >= 5:  # the first steps: the logged one and warm-up
                    times[name].append(time.perf_counter() - t0)
        one = torch.zeros((), dtype=torch.int64)
        bare = []
        for _ in range(200):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(one, op=dist.ReduceOp.MIN)
            bare.append(time.perf_counter() - t0)
        for watch in watches:
            watch.close()
        if rank == 0:
            plain = statistics.median(times["plain"])
            print(f"plain DDP step: {plain * 1e3:.2f} ms (median of {args.steps}; width {w}, batch {args.batch})")
            for name in ("watched", "sentinel"):
                print(f"{name:9s} {statistics.median(times[name]) / plain:.3f}x")
            share = statistics.median(agree[5:]) / plain
            print(f"of which the agreement: {statistics.median(agree[5:]) * 1e6:.0f} us per step ({share:.3f}x)")
            print(f"bare all_reduce of one int64: {statistics.median(bare) * 1e6:.0f} us (median of 200)")
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "init")
        mp.start_processes(_worker, args=(2, init, args), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()
