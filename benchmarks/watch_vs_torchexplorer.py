#!/usr/bin/env python
"""``tl.watch`` next to the ``torchexplorer`` package (the tool whose page ours follows), on the
same ResNet-18 training step (batch 16, 64x64, SGD, one thread), as ratios against a plain step
measured in the same run, steps interleaved.

torchexplorer is not a dependency: install it (and its dependencies: pygraphviz, which needs
Graphviz's headers, wandb, flask) into a separate folder and put it on PYTHONPATH, e.g.

    apt-get install libgraphviz-dev
    pip install --target /tmp/txlib --no-deps torchexplorer
    pip install --target /tmp/txlib pygraphviz wandb flask loguru click
    PYTHONPATH=/tmp/txlib .venv/bin/python benchmarks/watch_vs_torchexplorer.py

Both use 100 samples per tensor and the same four kinds. torchexplorer needs
``disable_inplace=True`` and ``ignore_io_grad_classes=[BasicBlock]`` on ResNet-18 (its full
backward hooks fail on in-place code); torchlens runs it as it is. torchexplorer writes with
its ``'none'`` backend here (no files), torchlens into its run database.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

import torchlens as tl


def main(steps: int = 30) -> None:
    try:
        import torchexplorer
    except ImportError:
        print("torchexplorer is not importable; see this script's docstring for how to install it.")
        return
    import torchvision
    from torchvision.models.resnet import BasicBlock

    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = torchvision.models.resnet18(weights=None, num_classes=10)
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
    folder = tempfile.mkdtemp()
    rows = {}
    for log_freq in (100, 1):
        variants = {
            "plain": copy.deepcopy(base),
            "torchlens": copy.deepcopy(base),
            "torchexplorer": copy.deepcopy(base),
        }
        w = tl.watch(
            variants["torchlens"],
            log_freq=log_freq,
            run_dir=os.path.join(folder, f"tl{log_freq}"),
            backend=None,
            verbose=False,
        )
        torchexplorer.watch(
            variants["torchexplorer"],
            log_freq=log_freq,
            backend="none",
            sample_n=100,
            disable_inplace=True,
            ignore_io_grad_classes=[BasicBlock],
            verbose=False,
        )
        optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in variants.items()}
        times = {k: [] for k in variants}
        for i in range(steps + 3):
            for key, model in variants.items():
                start = time.perf_counter()
                loss = nn.functional.cross_entropy(model(x), y)
                optimizers[key].zero_grad()
                loss.backward()
                optimizers[key].step()
                if i >= 3:
                    times[key].append(time.perf_counter() - start)
        w.close()
        plain = statistics.median(times["plain"])
        rows[log_freq] = {k: statistics.median(v) / plain for k, v in times.items() if k != "plain"}
        rows[log_freq]["plain_ms"] = plain * 1e3
    print(f"torch {torch.__version__}, ResNet-18 batch 16 64x64, one thread, {steps} timed steps each")
    print(f"{'':<24} {'plain step':>11} {'torchlens':>10} {'torchexplorer':>14}")
    for log_freq, label in ((100, "not logged (log_freq=100)"), (1, "logged (log_freq=1)")):
        r = rows[log_freq]
        print(f"{label:<24} {r['plain_ms']:>9.1f}ms {r['torchlens']:>9.3f}x {r['torchexplorer']:>13.3f}x")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
