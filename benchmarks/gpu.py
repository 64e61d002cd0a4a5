#!/usr/bin/env python
"""The cost of a trace on a GPU: each call's median wall time over a plain call, in one process.

Rows (after a warm-up; every time is read after ``torch.cuda.synchronize()``):

==========================  ====================================================================
row                         ratio of
==========================  ====================================================================
resnet18 b32                ``log_forward_pass`` (all saved), and ``layers_to_save=None``, to a
                            plain forward of torchvision's ResNet-18, 32x3x224x224, grad on, eval
gpt2 12 layers              the same for ``GPT2LMHeadModel(GPT2Config())`` on 1x128 tokens
llama 1B bf16               the same for a LLaMA-shaped 1B model (16 layers, hidden 2048) in
                            bfloat16 on 4x512 tokens
find_nonfinite              ``find_nonfinite(gpt2 2-layer, backward=True)`` to a plain forward
                            and backward of the same model
validate                    ``validate_model_activations`` of ResNet-18 (b32) to a plain forward
==========================  ====================================================================

Rounds alternate plain and traced calls so both see the same conditions. ``--quick`` runs
fewer rounds and smaller inputs; ``--device cpu`` runs the same rows on the CPU (a check of the
script, not a GPU figure); ``--json PATH`` writes the rows as JSON.

    python benchmarks/gpu.py [--quick] [--device cuda] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable, Dict, List

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402


def _clock(device: str, call: Callable[[], Any]) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def ratios(device: str, plain: Callable[[], Any], traced: Dict[str, Callable[[], Any]], rounds: int) -> Dict[str, Any]:
    """Median times of ``plain`` and each of ``traced``, measured in alternating rounds."""
    for call in [plain, *traced.values()]:  # warm-up: kernels chosen, caches filled
        call()
        call()
    times: Dict[str, List[float]] = {"plain": [], **{name: [] for name in traced}}
    for _ in range(rounds):
        times["plain"].append(_clock(device, plain))
        for name, call in traced.items():
            times[name].append(_clock(device, call))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    row: Dict[str, Any] = {"plain_ms": round(medians["plain"] * 1e3, 3)}
    for name in traced:
        row[f"{name}_ms"] = round(medians[name] * 1e3, 3)
        row[f"{name}_ratio"] = round(medians[name] / medians["plain"], 2)
    return row


def _gpt2(layers: int, width: int = 768) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=max(1, width // 64))
    return transformers.GPT2LMHeadModel(config).eval()


def _llama_1b(quick: bool) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=2048 if not quick else 256,
        intermediate_size=8192 if not quick else 1024,
        num_hidden_layers=16 if not quick else 2,
        num_attention_heads=32 if not quick else 4,
        num_key_value_heads=8 if not quick else 2,
        vocab_size=32000 if not quick else 1000,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return model.to_empty(device="cpu").to(torch.bfloat16).eval()


def _trace_row(device: str, model: nn.Module, args: tuple, rounds: int) -> Dict[str, Any]:
    return ratios(
        device,
        lambda: model(*args),
        {
            "all": lambda: tl.log_forward_pass(model, args),
            "none": lambda: tl.log_forward_pass(model, args, layers_to_save=None),
        },
        rounds,
    )


def _forward_rows(device: str, quick: bool, rounds: int) -> Dict[str, Dict[str, Any]]:
    rows: Dict[str, Dict[str, Any]] = {}
    batch = 32 if not quick else 4
    resnet = torchvision.models.resnet18(weights=None).eval().to(device)
    image = torch.randn(batch, 3, 224, 224, device=device)
    gpt2 = _gpt2(12 if not quick else 2).to(device)
    tokens = torch.randint(0, 50000, (1, 128), device=device)
    llama = _llama_1b(quick).to(device)
    llama_tokens = torch.randint(0, 1000, (4, 512) if not quick else (2, 64), device=device)
    for name, model, args in [
        (f"resnet18 b{batch}", resnet, (image,)),
        ("gpt2 12 layers" if not quick else "gpt2 2 layers", gpt2, (tokens,)),
        ("llama 1B bf16" if not quick else "llama tiny bf16", llama, (llama_tokens,)),
    ]:
        with torch.enable_grad():
            rows[name] = _trace_row(device, model, args, rounds)
        rows[name]["ops"] = len(tl.log_forward_pass(model, args, layers_to_save=None))
    del llama
    rows["validate resnet18"] = ratios(
        device,
        lambda: resnet(image),
        {"validate": lambda: tl.validate_model_activations(resnet, image, random_seed=0)},
        max(3, rounds // 4),
    )
    small = _gpt2(2).to(device)
    small_tokens = torch.randint(0, 50000, (2, 64), device=device)

    def forward_backward() -> None:
        small(small_tokens).logits.sum().backward()
        small.zero_grad(set_to_none=True)

    rows["find_nonfinite gpt2 2 layers"] = ratios(
        device,
        forward_backward,
        {"find_nonfinite": lambda: tl.find_nonfinite(small, small_tokens, backward=True)},
        rounds,
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    options = parser.parse_args()
    rounds = options.rounds or (5 if options.quick else 15)
    name = torch.cuda.get_device_name() if options.device == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, {rounds} rounds")
    rows = _forward_rows(options.device, options.quick, rounds)
    for row_name, row in rows.items():
        cells = ", ".join(f"{key} {value}" for key, value in row.items())
        print(f"{row_name:32s} {cells}")
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
