#!/usr/bin/env python
"""A logged training run past ``max_columns`` steps: does a logged step stay as cheap at step
1,000 as at step 10, and does the process's memory stay flat?

The other watch benchmarks time a few dozen steps; a run's database changes character later:
at logged step 512 (``max_columns``) every pair of neighbouring columns is merged into one, and
from then on each step is merged into the column of the step before it. This runs ResNet-18's
layers at an eighth of the width (the 62 modules and 432 series of ``watch_gpu.py --host``),
batch 2 at 32x32, one thread, on the CPU, logged at every step (the four default kinds), and
prints per block of steps: the median and the longest step (wall time, the write a durable step
waits for included), their ratio to a plain step of an identical model timed first, and the
process's resident memory.

    python benchmarks/watch_long_run.py [--steps 1100] [--every 100]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from typing import List

import torch
from torch import nn
from watch_gpu import narrow_resnet18

import torchlens as tl


def resident_mib() -> float:
    """The process's resident memory (Linux; NaN elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    except OSError:
        return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1100)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = narrow_resnet18()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])

    def timed_steps(model: nn.Module, n: int) -> List[float]:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        times = []
        for _ in range(n):
            start = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
        return times

    plain = statistics.median(timed_steps(copy.deepcopy(base), 200)[50:])
    model = copy.deepcopy(base)
    folder = tempfile.mkdtemp(prefix="torchlens-long-")
    print(f"plain step {plain * 1e3:.2f} ms; {args.steps} logged steps (432 series), run in {folder}")
    print(f"{'steps':>11} {'median ms':>10} {'ratio':>7} {'longest ms':>11} {'RSS MiB':>8}")
    with tl.watch(model, run_dir=folder, backend=None, verbose=False) as w:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        for first in range(0, args.steps, args.every):
            times = []
            for _ in range(min(args.every, args.steps - first)):
                start = time.perf_counter()
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()  # a durable step: returns once its write is committed
                times.append(time.perf_counter() - start)
            mid = statistics.median(times)
            print(
                f"{first + 1:>5}-{first + len(times):<5} {mid * 1e3:>10.2f} {mid / plain:>6.2f}x "
                f"{max(times) * 1e3:>11.1f} {resident_mib():>8.0f}"
            )
        print(f"stride at the end: {tl.open_run(w.run_dir).stride}")


if __name__ == "__main__":
    main()
