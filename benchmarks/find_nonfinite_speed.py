#!/usr/bin/env python
"""Cost of ``tl.find_nonfinite`` on a finite model, against a plain forward + backward.

For each model, in one process, on the CPU, with ``torch.set_num_threads(1)``:

* ``plain``     -- median time of ``loss = model(x).sum(); loss.backward()`` (the parameters'
                   ``.grad`` are cleared first, outside the timing);
* ``find``      -- median time of ``tl.find_nonfinite(model, x, backward=True)`` (it finds
                   nothing: the model is finite), and ``find fwd`` with ``backward=False``;
* ``ratio``     -- find / plain (the target is <= 1.5).

Rounds alternate plain and find calls after a warm-up, so both see the same machine. Models:
torchvision ResNet-18 (``weights=None``, input (2, 3, 224, 224)) and a small GPT-2
(``GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=256, n_head=4))``, random weights, ``input_ids``
of shape (1, 64), ``use_cache=False``, loss: the sum of the logits). GPT-2 is skipped when
``transformers`` is missing.

Run: ``.venv/bin/python benchmarks/find_nonfinite_speed.py [--rounds 7] [--models resnet18,gpt2]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

import torch

import torchlens as tl


def resnet18() -> Tuple[torch.nn.Module, Any, Dict[str, Any], Callable[[Any], torch.Tensor]]:
    import torchvision

    model = torchvision.models.resnet18(weights=None)
    return model, torch.randn(2, 3, 224, 224), {}, lambda out: out.sum()


def gpt2() -> Tuple[torch.nn.Module, Any, Dict[str, Any], Callable[[Any], torch.Tensor]]:
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=128)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (1, 64))
    return model, ids, {"use_cache": False}, lambda out: out.logits.sum()


MODELS = {"resnet18": resnet18, "gpt2": gpt2}


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, rounds: int) -> None:
    try:
        model, x, kwargs, loss_of = MODELS[name]()
    except ImportError as error:
        print(f"{name}: skipped ({error})")
        return

    def plain() -> None:
        loss_of(model(x, **kwargs)).backward()

    def find() -> None:
        report = tl.find_nonfinite(model, x, kwargs, backward=True, loss_fn=loss_of)
        assert not report.found, str(report)

    def find_forward() -> None:
        tl.find_nonfinite(model, x, kwargs, backward=False)

    for fn in (plain, find, find_forward):  # warm-up
        model.zero_grad(set_to_none=True)
        fn()
    times: Dict[str, List[float]] = {"plain": [], "find": [], "find fwd": []}
    for _ in range(rounds):
        for key, fn in (("plain", plain), ("find", find), ("find fwd", find_forward)):
            model.zero_grad(set_to_none=True)
            times[key].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{name}: plain fwd+bwd {med['plain'] * 1e3:.1f} ms, find_nonfinite {med['find'] * 1e3:.1f} ms "
        f"(backward=False: {med['find fwd'] * 1e3:.1f} ms); ratio {med['find'] / med['plain']:.2f}x "
        f"(fwd-only check / plain fwd+bwd: {med['find fwd'] / med['plain']:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="resnet18,gpt2")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name in args.models.split(","):
        measure(name, args.rounds)


if __name__ == "__main__":
    main()
