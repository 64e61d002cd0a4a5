#!/usr/bin/env python
"""What building the graph page costs next to the trace it shows (no browser).

``history.to_html()`` computes each saved activation's statistics for the details panel and
writes the page; this prints its process CPU time against that of the ``log_forward_pass``
that made the history, for a 2-layer GPT-2 at GPT-2 small's width on 64 tokens, one torch
thread, medians of alternating rounds. The page has been kept at or below its trace (about
1x): a ratio well above that is a regression of the page's statistics.

    python benchmarks/page_build_cost.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402

import torchlens as tl  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2)).eval()
    x = torch.randint(0, model.config.vocab_size, (1, 64))
    tl.log_forward_pass(model, x, random_seed=0).to_html()  # warm
    traced, paged = [], []
    for _ in range(rounds):
        start = time.process_time()
        history = tl.log_forward_pass(model, x, random_seed=0)
        traced.append(time.process_time() - start)
        start = time.process_time()
        history.to_html()
        paged.append(time.process_time() - start)
    trace, page = statistics.median(traced), statistics.median(paged)
    print(f"torch {torch.__version__}, 1 thread, {rounds} rounds, GPT-2 2 layers x 768, 64 tokens")
    print(f"  log_forward_pass {trace * 1e3:.1f} ms, to_html {page * 1e3:.1f} ms: page / trace {page / trace:.2f}x")


if __name__ == "__main__":
    main()
