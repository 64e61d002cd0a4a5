"""How post-processing (pruning, recurrence detection, labels, lookup) scales with model size.

Traces a model whose forward runs ``n`` operations (a recurrent cell in a Python loop, plus a
stack of distinct layers) for growing ``n`` and prints the capture and post-processing times.
Post-processing must stay near-linear: seconds, not minutes, at 100,000 operations.

    python benchmarks/postprocess_scaling.py            # up to 100k operations
    python benchmarks/postprocess_scaling.py --quick    # up to 10k
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import torchlens as tl


class LoopAndStack(nn.Module):
    def __init__(self, steps: int, depth: int = 50) -> None:
        super().__init__()
        self.steps = steps
        self.cell = nn.Linear(8, 8)
        self.stack = nn.ModuleList(nn.Linear(8, 8) for _ in range(depth))

    def forward(self, x):
        for layer in self.stack:
            x = torch.relu(layer(x))
        for _ in range(self.steps):
            x = torch.tanh(self.cell(x)) * 0.5 + x
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 30_000, 100_000]
    x = torch.rand(1, 8)
    print(f"{'operations':>10} {'capture s':>10} {'postprocess s':>14} {'us/op post':>11}")
    for target in sizes:
        model = LoopAndStack(steps=max(1, (target - 100) // 4))
        start = time.perf_counter()
        history = tl.log_forward_pass(model, x, layers_to_save=None)
        total = time.perf_counter() - start
        post = history.postprocess_time
        n = len(history)
        print(f"{n:>10} {total - post:>10.2f} {post:>14.2f} {1e6 * post / n:>11.1f}")


if __name__ == "__main__":
    main()
