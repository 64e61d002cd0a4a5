#!/usr/bin/env python
"""Cost of ``tl.compare`` on a GPT-2 of 12 layers and 128 tokens, against plain forwards.

In one process, on the CPU, with ``torch.set_num_threads(1)``; model a is GPT-2 small's shape,
``GPT2Model(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=128))`` with random
weights (``--n-embd 128`` gives a toy of it whose ops are so cheap that the tracer's fixed cost
per op dominates: the worst case for the ratio), model b a copy with one weight of block 5's MLP scaled by 1.01 (so every op after it
differs and each pair is measured in full), ``input_ids`` of shape (1, 128), ``use_cache=False``:

* ``plain``        -- median time of ``model_a(x)`` plus median time of ``model_b(x)``;
* ``histories``    -- median time of ``tl.compare(history_a, history_b)`` on two histories made
                      beforehand (target: <= 0.5 s);
* ``on disk``      -- the same on two histories saved and opened with ``tl.load`` (each
                      activation read from disk when its pair comes);
* ``models``       -- median time of ``tl.compare((model_a, x), (model_b, x))``, both traces
                      included, and its ratio to ``plain`` (target: <= 3x);
* ``traces``       -- for reference, two ``log_forward_pass`` calls alone.

Rounds alternate the measurements after a warm-up, so all see the same machine.

Run: ``.venv/bin/python benchmarks/compare_speed.py [--rounds 5]``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List

import torch

import torchlens as tl


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n-embd", type=int, default=768, help="width: 768 is GPT-2 small, 128 a toy of it")
    args = parser.parse_args()
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=12, n_embd=args.n_embd, n_head=max(1, args.n_embd // 64), n_positions=128)
    model_a = transformers.GPT2Model(config).eval()
    model_b = copy.deepcopy(model_a)
    with torch.no_grad():
        model_b.h[5].mlp.c_fc.weight.mul_(1.01)
    x = torch.randint(0, config.vocab_size, (1, 128))
    kwargs = {"use_cache": False}
    history_a = tl.log_forward_pass(model_a, x, kwargs, random_seed=0)
    history_b = tl.log_forward_pass(model_b, x, kwargs, random_seed=0)
    folder = tempfile.mkdtemp()
    loaded_a = tl.load(history_a.save(f"{folder}/a"))
    loaded_b = tl.load(history_b.save(f"{folder}/b"))
    print(f"GPT-2, 12 layers, n_embd={args.n_embd}, 128 tokens: {len(history_a)} ops per pass")

    with torch.no_grad():
        steps: Dict[str, Callable[[], Any]] = {
            "plain a": lambda: model_a(x, **kwargs),
            "plain b": lambda: model_b(x, **kwargs),
            "histories": lambda: tl.compare(history_a, history_b),
            "on disk": lambda: tl.compare(loaded_a, loaded_b),
            "models": lambda: tl.compare((model_a, x, kwargs), (model_b, x, kwargs), random_seed=0),
            "traces": lambda: [tl.log_forward_pass(m, x, kwargs, random_seed=0) for m in (model_a, model_b)],
        }
        for fn in steps.values():  # warm-up
            fn()
        times: Dict[str, List[float]] = {k: [] for k in steps}
        for _ in range(args.rounds):
            for key, fn in steps.items():
                times[key].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    plain = med["plain a"] + med["plain b"]
    cmp = tl.compare(history_a, history_b)
    print(f"first divergence: {cmp.first_divergence.label} in {cmp.first_divergence.module}")
    print(f"plain forwards (a + b): {plain * 1e3:.1f} ms")
    print(f"compare(history_a, history_b): {med['histories'] * 1e3:.1f} ms (target <= 500 ms)")
    print(f"compare of two loaded histories: {med['on disk'] * 1e3:.1f} ms")
    print(
        f"compare((model_a, x), (model_b, x)): {med['models'] * 1e3:.1f} ms = {med['models'] / plain:.2f}x the plain "
        f"forwards (target <= 3x); the two traces alone: {med['traces'] * 1e3:.1f} ms = {med['traces'] / plain:.2f}x"
    )


if __name__ == "__main__":
    main()
