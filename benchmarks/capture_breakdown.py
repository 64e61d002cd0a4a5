#!/usr/bin/env python
"""Where the time of ``log_forward_pass`` goes, stage by stage, against a plain forward pass.

``benchmarks/overhead.py`` gives the end-to-end ratio; this script splits it. Each *variant*
below adds one stage to the one before it; all variants of a model are run interleaved
(each round in a new random order) in one process with ``torch.set_num_threads(1)``, and each stage's
cost is the difference of the medians of two consecutive variants:

=================  ==============================================================================
variant            what runs
=================  ==============================================================================
plain              ``model(*args)`` with grad enabled
module hooks       the same, with two no-op global module hooks (what a pass registers)
wrapping           wrappers installed, the model run with no tracer active, wrappers removed
records            ``run_pass`` saving nothing, with the call-site walk stubbed out
frames             ``run_pass`` saving nothing (call sites recorded): what ``get_model_metadata``'s pass costs
copies             ``run_pass`` saving every activation
postprocess        ``run_pass`` + ``build_history``
log_forward_pass   the public call, ``layers_to_save='all'`` (adds request parsing etc.)
get_model_metadata the public call (no activations saved)
outputs kept       ``plain`` holding every module's output until it returns (a copy where the
                   module works in place), as a pass that saves everything holds them: on the CPU
                   that alone costs fresh memory and cache misses, a floor no tracer can go under
=================  ==============================================================================

Models: a 5-layer MLP (``Linear(64, 64)`` x 5 with ReLUs, batch 8), torchvision ResNet-18
(1x3x224x224) and GPT-2 (``GPT2LMHeadModel(GPT2Config())``, random weights, 128 tokens); on
request the cheap-kernel models of ``capture_per_op.py``: ``resnet18-32`` (a 32x32 input) and
``gpt2-12x64`` (12 layers of width 64, 8 tokens).
Absolute times on a shared machine are indicative; the ratios are what to compare.

    python benchmarks/capture_breakdown.py [--models mlp,resnet18,gpt2] [--repeats N] [--validate]

``--validate`` also times ``validate_model_activations`` (slow: many replays).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens.trace.capture import decorate, ops  # noqa: E402
from torchlens.trace.capture.run import run_pass  # noqa: E402
from torchlens.trace.capture.save_plan import SavePlan  # noqa: E402
from torchlens.trace.capture.stack import StackWalker  # noqa: E402
from torchlens.trace.postprocess import build_history  # noqa: E402


def build(name: str) -> Tuple[nn.Module, tuple, dict]:
    torch.manual_seed(0)
    if name == "mlp":
        layers: List[nn.Module] = []
        for _ in range(5):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        return nn.Sequential(*layers[:-1]).eval(), (torch.randn(8, 64),), {}
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(weights=None).eval(), (torch.randn(1, 3, 224, 224),), {}
    if name == "resnet18-32":  # cheap kernels: the tracer's own cost per op (capture_per_op.py)
        import torchvision

        return torchvision.models.resnet18(weights=None).eval(), (torch.randn(1, 3, 32, 32),), {}
    if name == "gpt2-12x64":
        import transformers

        config = transformers.GPT2Config(
            n_layer=12, n_embd=64, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0
        )
        return transformers.GPT2LMHeadModel(config).eval(), (), {"input_ids": torch.randint(0, 1000, (1, 8))}
    if name == "gpt2":
        import transformers

        config = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(config).eval()
        return model, (), {"input_ids": torch.randint(0, config.vocab_size, (1, 128))}
    raise ValueError(name)


def variants(model: nn.Module, args: tuple, kwargs: dict, validate: bool) -> Dict[str, Callable[[], Any]]:
    table = decorate.wrapper_table()

    def plain() -> Any:
        with torch.enable_grad():
            return model(*args, **kwargs)

    def hooked() -> Any:
        handles = [
            nn.modules.module.register_module_forward_pre_hook(lambda m, a: None),
            nn.modules.module.register_module_forward_hook(lambda m, a, o: None, always_call=True),
        ]
        try:
            return plain()
        finally:
            for h in handles:
                h.remove()

    def kept() -> Any:
        outputs: List[Any] = []

        def keep(module: nn.Module, inputs: Any, output: Any) -> None:
            in_place = getattr(module, "inplace", False) and isinstance(output, torch.Tensor)
            outputs.append(output.detach().clone() if in_place else output)

        handle = nn.modules.module.register_module_forward_hook(keep)
        try:
            return plain(), outputs
        finally:
            handle.remove()

    def wrapped() -> Any:
        ops.install(table)
        try:
            return hooked()
        finally:
            ops.uninstall(table)

    def records() -> Any:
        original = StackWalker.walk
        StackWalker.walk = lambda self, frame: ()  # type: ignore[method-assign]
        try:
            return run_pass(model, args, kwargs, SavePlan(), random_seed=0)
        finally:
            StackWalker.walk = original  # type: ignore[method-assign]

    found: Dict[str, Callable[[], Any]] = {
        "plain": plain,
        "module hooks": hooked,
        "wrapping": wrapped,
        "records": records,
        "frames": lambda: run_pass(model, args, kwargs, SavePlan(), random_seed=0),
        "copies": lambda: run_pass(model, args, kwargs, SavePlan(save_all=True), random_seed=0),
        "postprocess": lambda: build_history(run_pass(model, args, kwargs, SavePlan(save_all=True), random_seed=0)),
        "log_forward_pass": lambda: tl.log_forward_pass(
            model, list(args), input_kwargs=kwargs or None, layers_to_save="all", random_seed=0
        ),
        "get_model_metadata": lambda: tl.get_model_metadata(
            model, list(args), input_kwargs=kwargs or None, random_seed=0
        ),
    }
    found["outputs kept"] = kept
    if validate:
        found["validate"] = lambda: tl.validate_model_activations(
            model, list(args), input_kwargs=kwargs or None, random_seed=0
        )
    return found


def measure(funcs: Dict[str, Callable[[], Any]], repeats: int) -> Dict[str, float]:
    for f in funcs.values():  # warm-up: wrapper table, caches, allocator
        f()
    times: Dict[str, List[float]] = {k: [] for k in funcs}
    gc.collect()
    order = list(funcs)
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        # no collection per round: results hold no reference cycles (``del out`` frees them), and
        # a full collection leaves the caches cold for whichever variant comes next. Each timed
        # call follows an untimed one of the same variant: a call right after the release of 30 MB
        # of activations pays for fresh pages (glibc gave them back to the OS), and that cost is
        # the variant's own in a loop, not its neighbour's. A new order each round.
        shuffle(order)
        for key in order:
            f = funcs[key]
            del_me = f()
            del del_me
            start = time.perf_counter()
            out = f()
            times[key].append(time.perf_counter() - start)
            del out
    return {k: statistics.median(v) for k, v in times.items()}


def report(name: str, medians: Dict[str, float], ops: int) -> None:
    plain = medians["plain"]
    print(f"\n{name}: {ops} logged operations; plain forward {plain * 1e3:.2f} ms")
    print(f"  {'stage':<20}{'adds ms':>10}{'adds/plain':>12}{'cumulative':>12}{'ratio':>8}")
    chain = ["plain", "module hooks", "wrapping", "records", "frames", "copies", "postprocess", "log_forward_pass"]
    previous = plain
    for key in chain[1:]:
        value = medians[key]
        print(
            f"  {key:<20}{(value - previous) * 1e3:>10.2f}{(value - previous) / plain:>12.3f}"
            f"{value * 1e3:>12.2f}{value / plain:>7.2f}x"
        )
        previous = value
    for key in ("get_model_metadata", "outputs kept", "validate"):
        if key in medians:
            print(f"  {key:<20}{'':>10}{'':>12}{medians[key] * 1e3:>12.2f}{medians[key] / plain:>7.2f}x")
    ops_time = medians["postprocess"] - medians["copies"]
    print(
        f"  per operation: capture {(medians['frames'] - medians['wrapping']) / max(ops, 1) * 1e6:.1f} us, "
        f"copy {(medians['copies'] - medians['frames']) / max(ops, 1) * 1e6:.1f} us, "
        f"postprocess {ops_time / max(ops, 1) * 1e6:.1f} us"
    )


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,resnet18,gpt2")
    parser.add_argument("--repeats", type=int, default=0, help="interleaved rounds (default: by model)")
    parser.add_argument("--validate", action="store_true", help="also time validate_model_activations")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}; medians of interleaved runs")
    for name in opts.models.split(","):
        model, args, kwargs = build(name.strip())
        repeats = opts.repeats or {"mlp": 40, "resnet18": 9, "gpt2": 5}.get(name, 5)
        funcs = variants(model, args, kwargs, opts.validate)
        medians = measure(funcs, repeats)
        ops = len(tl.get_model_metadata(model, list(args), input_kwargs=kwargs or None, random_seed=0))
        report(name, medians, ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
