#!/usr/bin/env python
"""Tracing LLMs too big for this machine on the ``meta`` device: time and memory.

A Llama-3-8B-shaped model (32 layers, hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocab
128256) and a 70B-shaped one (80 layers, hidden 8192, 64 heads, 8 KV heads, MLP 28672), each
built with ``transformers.LlamaForCausalLM`` under ``with torch.device("meta")`` (no memory for
weights), traced with ``tl.log_forward_pass`` on ``input_ids`` of shape (1, 128) on meta:

* ``build``  -- building the meta model (not part of the targets);
* ``trace``  -- ``log_forward_pass`` once the model is built (targets: 8B <= 3 s, 70B <= 8 s);
* ``RSS``    -- peak resident memory during the trace above the resident memory before it
                (``/proc/self/status`` VmHWM, its peak reset through ``/proc/self/clear_refs``
                first; target for 8B: <= 300 MB);
* ``ops``    -- layers in the history.

One trace per model (a first call of each torch function costs more than the next: the figure
is the one a user gets). Run: ``.venv/bin/python benchmarks/meta_trace_speed.py [--only 8b]``
"""

from __future__ import annotations

import argparse
import time
from typing import Dict

import torch
import transformers

import torchlens as tl

SHAPES: Dict[str, Dict[str, int]] = {
    "8b": dict(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
    ),
    "70b": dict(
        num_hidden_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=28672,
        vocab_size=128256,
    ),
}
TARGETS = {"8b": 3.0, "70b": 8.0}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def measure(name: str) -> None:
    config = transformers.LlamaConfig(**SHAPES[name])
    start = time.perf_counter()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
    build = time.perf_counter() - start
    ids = torch.zeros(1, 128, dtype=torch.long, device="meta")
    reset = _reset_peak()
    rss_before = _status_kb("VmRSS")
    start = time.perf_counter()
    history = tl.log_forward_pass(model, ids)
    trace = time.perf_counter() - start
    growth_mb = (_status_kb("VmHWM") - rss_before) / 1024
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{name:>4}: {n_params / 1e9:.1f}B parameters, build {build:.2f} s, trace {trace:.2f} s "
        f"(target <= {TARGETS[name]:.0f} s), peak RSS growth {growth_mb:.0f} MB"
        f"{'' if reset else ' (peak not reset: since process start)'}, {len(history.layer_labels)} layers"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SHAPES), default=None)
    options = parser.parse_args()
    for name in [options.only] if options.only else ["8b", "70b"]:
        measure(name)


if __name__ == "__main__":
    main()
