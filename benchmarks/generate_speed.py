#!/usr/bin/env python
"""``tl.log_generate`` against a plain ``model.generate`` measured in the same run.

A tiny GPT-2 and a tiny LLaMA (2 layers, hidden 64, vocab 100, random weights built from a
config), greedy decoding of a 5-token prompt with a DynamicCache, one torch thread:

* ``lm_head``   -- ``layers_to_save=['lm_head']`` (module outputs: later decode steps reuse
                   the first one's structure), 100 new tokens; target <= 2x plain;
* ``metadata``  -- ``layers_to_save=None`` (every operation of every step recorded, no
                   values: later decode steps run with the lean tracer on the first one's
                   structure), 100 new tokens; target <= 4x plain;
* ``100/50``    -- time(100 steps) / time(50 steps) of the ``metadata`` run; target <= 2.2
                   (cost linear in steps);
* ``plain 100/50`` -- the same ratio for a plain ``generate`` (its later steps attend over a
                   longer cache too);
* ``traced``    -- ``layers_to_save=['lm_head'], reuse_structure=False`` (every step traced
                   fully), 100 new tokens, for comparison.

Times are CPU time of this process (``time.process_time``; one torch thread, so it is the work
done, less disturbed by other processes on a shared machine than wall time), the median of
``--repeats`` alternating rounds (default 3), after one untimed run of each.
Run: ``.venv/bin/python benchmarks/generate_speed.py [--repeats 3]``

Measured (2 cores, shared, load 0.8-1.6; two runs): GPT-2 plain 252-275 ms, lm_head 1.44-1.67x,
metadata 2.86-2.94x, 100/50 1.87-2.35 (plain's 1.90-2.25), traced 4.71-4.87x; LLaMA plain
286-339 ms, lm_head 1.39-1.44x, metadata 3.09-3.22x, 100/50 1.88-2.06 (plain's 2.02-2.13),
traced 4.64-4.75x. Before the lean steps metadata was 4.7-6.0x.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Dict, List

import torch
import transformers

import torchlens as tl

PROMPT = torch.tensor([[1, 2, 3, 4, 5]])


def gpt2() -> Any:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=256)
    return transformers.GPT2LMHeadModel(config).eval()


def llama() -> Any:
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(config).eval()


def measure(model: Any, repeats: int) -> Dict[str, float]:
    def options(n: int) -> Dict[str, Any]:
        return dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

    runs: Dict[str, Callable[[], Any]] = {
        "plain": lambda: model.generate(PROMPT, **options(100)),
        "plain50": lambda: model.generate(PROMPT, **options(50)),
        "head": lambda: tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **options(100)),
        "traced": lambda: tl.log_generate(
            model, PROMPT, layers_to_save=["lm_head"], reuse_structure=False, **options(100)
        ),
        "meta100": lambda: tl.log_generate(model, PROMPT, layers_to_save=None, **options(100)),
        "meta50": lambda: tl.log_generate(model, PROMPT, layers_to_save=None, **options(50)),
    }
    for run in runs.values():
        run()  # untimed: first calls of each torch function cost more
    times: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # in alternating rounds, so that a busy spell of the machine hits all alike
        for name, run in runs.items():
            start = time.process_time()
            run()
            times[name].append(time.process_time() - start)
    t = {name: statistics.median(values) for name, values in times.items()}
    return {
        "plain_ms": t["plain"] * 1000,
        "lm_head": t["head"] / t["plain"],
        "metadata": t["meta100"] / t["plain"],
        "100/50": t["meta100"] / t["meta50"],
        "plain 100/50": t["plain"] / t["plain50"],
        "traced": t["traced"] / t["plain"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(
        "model   plain 100 tok   lm_head (<=2x)   metadata (<=4x)   100/50 (<=2.2)   plain 100/50   traced every step"
    )
    for name, make in (("gpt2", gpt2), ("llama", llama)):
        r = measure(make(), repeats)
        print(
            f"{name:<7} {r['plain_ms']:10.0f} ms   {r['lm_head']:13.2f}x   {r['metadata']:14.2f}x   "
            f"{r['100/50']:14.2f}   {r['plain 100/50']:12.2f}   {r['traced']:12.2f}x"
        )


if __name__ == "__main__":
    main()
