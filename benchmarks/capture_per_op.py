#!/usr/bin/env python
"""What a trace adds per operation where kernels are cheap, and whether it grows with the process.

Two measurements, in one process, with ``torch.set_num_threads(1)`` (times are CPU time of the
process, ``time.process_time``, medians over interleaved rounds):

* **per op**: ``(trace - plain forward) / ops`` in microseconds, for models whose kernels cost
  little, so that the tracer's own Python is what is measured: ResNet-18 on a 1x3x32x32 input
  and a GPT-2 of 12 layers at width 64 on 8 tokens; also ``layers_to_save=None``.
* **collector**: the garbage collector's wall time per trace in a loop of ``--traces`` traces,
  split by generation (``gc.callbacks``; the trace's own time here is wall time too). A pass pauses automatic collection, so this is
  what its history costs afterwards: the first young collection scans the whole history it
  returned, and the full collections that the histories promoted on the way trigger walk every
  object of the process (all of torch's), however small the model.
* **device work**: the ATen operations of a plain forward (``torch.profiler`` on the CPU,
  top-level operations) and the copies a trace adds to them, each a kernel launch on a GPU (the
  trace runs the model's own operations, nothing else). Counted twice: as the CPU runs a trace
  (every buffer copied when first read) and as a GPU does (the buffers of an eval model copied
  together at the end: one ``_foreach_copy_`` for all of them, counted as one).
* **heap**: the same ResNet-18 trace in this (small) process, then after ``gc.freeze()`` and two
  million more live objects (a notebook with a dataset loaded, a server that froze its heap
  before forking): the ratio of the two medians. A pass that walked the heap would cost several
  times more in the big process; one that does not costs the same.

    python benchmarks/capture_per_op.py [--rounds 15] [--traces 300] [--objects 2000000]
"""

from __future__ import annotations

import argparse
import gc
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


def medians(calls: Dict[str, Callable[[], Any]], rounds: int) -> Dict[str, float]:
    for call in calls.values():
        call()
    times: Dict[str, List[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.process_time()
            call()
            times[name].append(time.process_time() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def models() -> Dict[str, tuple]:
    torch.manual_seed(0)
    found: Dict[str, tuple] = {
        "resnet18 32x32": (torchvision.models.resnet18(weights=None).eval(), torch.randn(1, 3, 32, 32)),
    }
    try:
        import transformers

        config = transformers.GPT2Config(
            n_layer=12, n_embd=64, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0
        )
        found["gpt2 12x64, 8 tokens"] = (transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 1000, (1, 8)))
    except ImportError:
        print("(transformers is not installed: the GPT-2 row is skipped)")
    return found


def per_op(model: nn.Module, x: torch.Tensor, rounds: int) -> str:
    ops = len(tl.log_forward_pass(model, x, layers_to_save=None))
    t = medians(
        {
            "plain": lambda: model(x),
            "all": lambda: tl.log_forward_pass(model, x),
            "none": lambda: tl.log_forward_pass(model, x, layers_to_save=None),
        },
        rounds,
    )
    extra = {name: (t[name] - t["plain"]) / ops * 1e6 for name in ("all", "none")}
    return (
        f"{ops} ops, plain {t['plain'] * 1e3:.2f} ms, trace {t['all'] * 1e3:.2f} ms ({t['all'] / t['plain']:.2f}x): "
        f"{extra['all']:.0f} us/op (layers_to_save=None: {extra['none']:.0f} us/op)"
    )


def collector(model: nn.Module, x: torch.Tensor, traces: int) -> str:
    """Milliseconds of garbage collection per trace, by generation, and their share of the trace."""
    spent = [0.0, 0.0, 0.0]
    runs = [0, 0, 0]
    started = [0.0]

    def timer(phase: str, info: Dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - started[0]
            runs[info["generation"]] += 1

    tl.log_forward_pass(model, x)
    gc.callbacks.append(timer)
    try:
        start = time.perf_counter()
        for _ in range(traces):
            tl.log_forward_pass(model, x)
        total = time.perf_counter() - start
    finally:
        gc.callbacks.remove(timer)
    per_trace = [s / traces * 1e3 for s in spent]
    by_generation = ", ".join(f"gen{g} {ms:.2f} ms ({runs[g]} runs)" for g, ms in enumerate(per_trace))
    return f"{sum(per_trace):.2f} ms of {total / traces * 1e3:.2f} ms per trace ({sum(spent) / total:.1%}): {by_generation}"


def top_level_ops(run: Callable[[], Any]) -> List[str]:
    """Names of the ATen operations ``run`` calls directly (not those inside another one), a
    copy of an empty tensor (which launches no kernel) named ``empty copy``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    inner = {id(child) for e in events for child in e.cpu_children}
    return [
        "empty copy" if e.name == "aten::clone" and e.input_shapes and 0 in e.input_shapes[0] else e.name
        for e in events
        if id(e) not in inner
    ]


def device_work(model: nn.Module, x: torch.Tensor) -> str:
    from torchlens.trace.capture import copy_on_write

    plain = top_level_ops(lambda: model(x))
    found: List[int] = []
    for cpu_copies_at_once in (True, False):  # as on the CPU, then as on a GPU
        copy_on_write.CPU_COPIES_AT_ONCE = cpu_copies_at_once
        try:
            ops = top_level_ops(lambda: tl.log_forward_pass(model, x))
        finally:
            copy_on_write.CPU_COPIES_AT_ONCE = True
        found.append(ops.count("aten::clone") + ops.count("aten::_foreach_copy_"))
    return (
        f"plain forward {len(plain)} ATen ops; a trace adds {found[0]} copies as on the CPU, "
        f"{found[1]} as on a GPU (launches of copy kernels; copies of empty tensors, which launch "
        "none, left out)"
    )


def heap(model: nn.Module, x: torch.Tensor, rounds: int, objects: int) -> str:
    trace = {"trace": lambda: tl.log_forward_pass(model, x)}
    small = medians(trace, rounds)["trace"]
    gc.freeze()
    ballast = [[i] for i in range(objects)]
    try:
        big = medians(trace, rounds)["trace"]
    finally:
        del ballast
        gc.unfreeze()
    return f"small process {small * 1e3:.2f} ms, frozen + {objects:,} objects {big * 1e3:.2f} ms: {big / small:.3f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--objects", type=int, default=2_000_000)
    options = parser.parse_args()
    torch.set_num_threads(1)
    found = models()
    for name, (model, x) in found.items():
        print(f"{name:24s} {per_op(model, x, options.rounds)}")
        print(f"{'  collector':24s} {collector(model, x, options.traces)}")
        print(f"{'  device work':24s} {device_work(model, x)}")
    model, x = found["resnet18 32x32"]
    print(f"{'heap, resnet18 32x32':24s} {heap(model, x, options.rounds, options.objects)}")


if __name__ == "__main__":
    main()
