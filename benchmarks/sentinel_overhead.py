#!/usr/bin/env python
"""Cost of the NaN sentinel (``tl.watch(on_nonfinite=...)``) on training steps that are not
logged, as ratios against a plain training step measured in the same run.

Three identical ResNet-18 copies train on the same batch, their steps interleaved (plain,
watched, watched + sentinel, plain, ...) so that all three see the same machine:

* ``plain``     -- forward, cross-entropy, backward, SGD step, without watch;
* ``watched``   -- ``tl.watch(log_freq=10**9)``: after the first, no step is logged;
* ``sentinel``  -- the same with ``on_nonfinite="raise"``: every step checks the outputs, the
                   gradient reaching them and every parameter's gradient on the device, and
                   reads one flag on the host when backward ends.

Ratios are medians of per-step times over the median plain step (on CUDA each step ends with a
synchronize). Target (issue 21): the sentinel's step <= 1.03x.

    .venv/bin/python benchmarks/sentinel_overhead.py [--steps 30] [--batch 16] [--size 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from typing import Dict, List

import torch
from torch import nn

import torchlens as tl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=64, help="image side")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    args = parser.parse_args()
    import torchvision

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    base = torchvision.models.resnet18(weights=None, num_classes=10).to(device)
    variants = {name: copy.deepcopy(base) for name in ("plain", "watched", "sentinel")}
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    watches = [
        tl.watch(variants["watched"], log_freq=10**9, backend=None, run_dir=tempfile.mkdtemp(), verbose=False),
        tl.watch(
            variants["sentinel"],
            log_freq=10**9,
            backend=None,
            run_dir=tempfile.mkdtemp(),
            verbose=False,
            on_nonfinite="raise",
        ),
    ]
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in variants.items()}
    times: Dict[str, List[float]] = {k: [] for k in variants}
    try:
        for i in range(args.steps + 3):  # three warm-up rounds, the first (logged) step among them
            for name, model in variants.items():
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                loss = nn.functional.cross_entropy(model(x), y)
                optimizers[name].zero_grad()
                loss.backward()
                optimizers[name].step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= 3:
                    times[name].append(time.perf_counter() - start)
    finally:
        for w in watches:
            w.close()
    plain = statistics.median(times["plain"])
    print(f"ResNet-18, batch {args.batch}, {args.size}x{args.size}, {device.type}, {args.steps} steps per variant")
    print(f"  plain step: {plain * 1e3:.1f} ms")
    for name in ("watched", "sentinel"):
        print(f"  {name:9s} (not logged): {statistics.median(times[name]) / plain:.3f}x")
    print(f"  sentinel vs watched: {statistics.median(times['sentinel']) / statistics.median(times['watched']):.3f}x")


if __name__ == "__main__":
    main()
