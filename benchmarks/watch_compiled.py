#!/usr/bin/env python
"""Cost of ``tl.watch`` on a compiled model: ResNet-18 (batch 16, 64x64) under
``torch.compile`` (inductor), as ratios against the same compiled model without watch.

Three copies are compiled and trained on the same batches in one process, their steps
interleaved (plain, not logged, logged, plain, ...):

* ``compiled``    -- ``torch.compile(model)`` without watch;
* ``not logged``  -- watched with ``log_freq=1000``: the compiled code runs untouched;
* ``logged``      -- watched with ``log_freq=1``: every step is logged, so it runs eagerly
                     (``set_stance("force_eager")``, see torchlens/train/model/compiled.py) with the hooks;
* ``eager``       -- the eager model without watch, for scale.

Ratios are medians of per-step times over the median compiled step. Dynamo's counts (graphs,
graph breaks, frames compiled) are printed for the watched copies: the watch adds none.

    .venv/bin/python benchmarks/watch_compiled.py [--steps 20] [--backend inductor]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch
import torch._dynamo
import torchvision
from torch import nn

import torchlens as tl
from torchlens.train.model.compiled import dynamo_counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = torchvision.models.resnet18(weights=None, num_classes=10)
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
    models = {name: copy.deepcopy(base) for name in ("compiled", "not logged", "logged", "eager")}
    calls = {n: torch.compile(m, backend=args.backend) for n, m in models.items() if n != "eager"}
    calls["eager"] = models["eager"]
    opts = {n: torch.optim.SGD(m.parameters(), lr=0.01) for n, m in models.items()}
    before = dynamo_counts()
    watches = [
        tl.watch(calls["not logged"], log_freq=1000, run_dir=tempfile.mkdtemp(), backend=None, verbose=False),
        tl.watch(calls["logged"], log_freq=1, run_dir=tempfile.mkdtemp(), backend=None, verbose=False),
    ]
    times: dict = {n: [] for n in calls}
    for i in range(args.steps + 3):  # 3 warm-up rounds: compilation happens there
        for name, call in calls.items():
            start = time.perf_counter()
            opts[name].zero_grad()
            nn.functional.cross_entropy(call(x), y).backward()
            opts[name].step()
            if i >= 3:
                times[name].append(time.perf_counter() - start)
    for w in watches:
        w.close()
    after = dynamo_counts()
    plain = statistics.median(times["compiled"])
    print(f"ResNet-18, batch 16 x 3 x 64 x 64, backend={args.backend}, {args.steps} steps, 1 thread")
    for name, t in times.items():
        print(f"  {name:<11} {statistics.median(t) * 1000:8.1f} ms  {statistics.median(t) / plain:5.2f}x compiled")
    print("  Dynamo, all four copies:", {k: after[k] - before[k] for k in after})


if __name__ == "__main__":
    main()
