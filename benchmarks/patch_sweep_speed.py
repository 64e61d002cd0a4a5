#!/usr/bin/env python
"""Cells per second of ``tl.patch_sweep`` on GPT-2 small's shape, against running the model once per cell.

In one process, on the CPU, with ``torch.set_num_threads(1)``: ``GPT2LMHeadModel(GPT2Config(
n_layer=12, n_embd=768, n_head=12))`` with random weights (``--n-embd 128``: a toy of it), a
clean and a corrupted input of 16 tokens (one token changed), the metric a logit difference at
the last position. The grid is every block's output x every position: 12 x 16 = 192 cells.

* ``hooks``   -- the classic way: for each cell, one ``model(corrupt)`` with a forward hook that
                 writes the clean block output at that position (the clean outputs captured
                 once beforehand); the time per cell;
* ``sweep``   -- ``tl.patch_sweep(model, corrupt, source=clean, metric=...)``, all included (its
                 trace, one plain call for the output's shape, the cells, and the check of one
                 cell against the model); cells per second and the ratio to ``hooks``;
* ``cells``   -- the cells alone (``grid.seconds``): each re-runs only the ops downstream of its
                 block from the saved graph;
* ``CPU time``  -- both again in process time (one thread), which a busy machine disturbs less;
* ``max |sweep - hooks|`` -- the two grids agree.

Cells at positions before the changed token cost almost nothing in the sweep: there the clean
value equals the corrupted one, the patch changes no element, and nothing is re-run.

Run: ``.venv/bin/python benchmarks/patch_sweep_speed.py [--n-embd 768] [--tokens 16]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import torchlens as tl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-embd", type=int, default=768, help="width: 768 is GPT-2 small, 128 a toy of it")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    import transformers

    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=12, n_embd=args.n_embd, n_head=max(1, args.n_embd // 64))
    model = transformers.GPT2LMHeadModel(config).eval()
    clean_ids = torch.randint(0, config.vocab_size, (1, args.tokens))
    corrupt_ids = clean_ids.clone()
    corrupt_ids[0, args.tokens // 2] = (clean_ids[0, args.tokens // 2] + 1) % config.vocab_size

    def metric(out):
        return out.logits[0, -1, 0] - out.logits[0, -1, 1]

    blocks = list(model.transformer.h)
    clean_outputs = {}
    handles = [
        b.register_forward_hook(lambda m, i, o, k=k: clean_outputs.__setitem__(k, o[0] if isinstance(o, tuple) else o))
        for k, b in enumerate(blocks)
    ]
    with torch.no_grad():
        model(clean_ids)
    for h in handles:
        h.remove()

    def hooked(k: int, position: int) -> float:
        def patch(m, i, o):
            value = (o[0] if isinstance(o, tuple) else o).clone()
            value[:, position] = clean_outputs[k][:, position]
            return (value,) + tuple(o[1:]) if isinstance(o, tuple) else value

        handle = blocks[k].register_forward_hook(patch)
        try:
            with torch.no_grad():
                return metric(model(corrupt_ids)).item()
        finally:
            handle.remove()

    hooked(0, 0)  # warm-up
    start, cpu = time.perf_counter(), time.process_time()
    reference = np.array([[hooked(k, p) for p in range(args.tokens)] for k in range(len(blocks))])
    hooks, hooks_cpu = time.perf_counter() - start, time.process_time() - cpu
    cells = reference.size

    clean = tl.log_forward_pass(model, clean_ids, random_seed=0)
    start, cpu = time.perf_counter(), time.process_time()
    grid = tl.patch_sweep(model, corrupt_ids, source=clean, metric=metric, random_seed=0)
    sweep, sweep_cpu = time.perf_counter() - start, time.process_time() - cpu

    print(f"GPT-2 (12 layers, n_embd {args.n_embd}, {args.tokens} tokens): {cells} cells (block x position)")
    print(f"hooks: {hooks / cells * 1000:.1f} ms per cell ({cells / hooks:.1f} cells/s)")
    print(f"sweep: {sweep:.2f} s in all, {cells / sweep:.1f} cells/s: {hooks / sweep:.2f}x faster than hooks")
    print(
        f"cells: {grid.seconds / cells * 1000:.1f} ms per cell ({cells / grid.seconds:.1f} cells/s): "
        f"{hooks / grid.seconds:.2f}x faster than hooks; modes {grid.modes}"
    )
    print(
        f"CPU time (one thread; steadier on a busy machine): hooks {hooks_cpu:.2f} s, sweep {sweep_cpu:.2f} s: "
        f"{hooks_cpu / sweep_cpu:.2f}x"
    )
    print(f"max |sweep - hooks|: {np.abs(grid.values - reference).max():.2e}")


if __name__ == "__main__":
    main()
