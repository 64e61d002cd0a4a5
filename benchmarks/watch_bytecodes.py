#!/usr/bin/env python
"""The Python a logged training step runs, counted in bytecodes: the same, to a few, on every run.

On a GPU a logged step's cost is the host's Python (the kernels are cheap), and on a shared CPU
its time swings more than most changes move it. The bytecodes the interpreter executes do not
swing: this script counts them (``sys.settrace`` with opcode events) for a plain step and for a
logged one, on the training thread and on the watch's writer thread, and prints the functions
that run the most. The model is ``watch_gpu.py --host``'s (ResNet-18's 62 modules at an eighth
of the width, batch 2 at 32x32, the step's tensors measured as a CUDA step measures them, the
one-launch row statistics replaced by one small operation), so the figures stand for the host's
share of a GPU step, but for one difference: its samples are on the CPU, so the writer thread
bins the forward's series while the backward pass runs and the rest at the step's end, where a
GPU step bins them all in one write at the end. Bytecodes are not time (a bytecode that calls into torch costs more than
one that adds two ints): compare these figures with each other, before and after a change.

    python benchmarks/watch_bytecodes.py [--steps 5] [--top 25] [--cpu-path]

``--cpu-path``: the step's tensors measured as a CPU step measures them (copied, measured on the
writer thread) instead.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Counter, Optional

import torch
from torch import nn

import torchlens as tl


class Bytecodes:
    """Counts the bytecodes run while ``on``, by ``file:function`` and by thread name."""

    def __init__(self) -> None:
        self.on = False
        self.by_function: Counter[str] = collections.Counter()
        self.by_thread: Counter[str] = collections.Counter()

    def trace(self, frame: FrameType, event: str, arg: Any) -> Optional[Callable]:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        where = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
        thread = threading.current_thread().name

        def local(frame: FrameType, event: str, arg: Any) -> Callable:
            if event == "opcode" and self.on:
                self.by_function[where] += 1
                self.by_thread[thread] += 1
            return local

        return local

    def clear(self) -> None:
        self.by_function.clear()
        self.by_thread.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="logged steps counted (default 5)")
    parser.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    parser.add_argument("--cpu-path", action="store_true", help="measure as a CPU step does")
    args = parser.parse_args()
    from torchlens.train.measure import batch

    sys.path.insert(0, str(Path(__file__).parent))
    from watch_gpu import narrow_resnet18

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = narrow_resnet18()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    counter = Bytecodes()
    for _ in range(3):
        step()
    sys.settrace(counter.trace)
    counter.on = True
    step()
    counter.on = False
    sys.settrace(None)
    plain = sum(counter.by_thread.values())
    counter.clear()

    row_stats = batch.row_stats
    threading.settrace(counter.trace)  # the writer thread, started by the watch's first write
    try:
        with tempfile.TemporaryDirectory() as folder:
            w = tl.watch(model, run_dir=folder, backend=None, verbose=False)
            if not args.cpu_path:
                w.recorder.batch_devices = frozenset({"cpu"})  # what a CUDA step runs
                batch.row_stats = lambda v: v.new_zeros(v.shape[0], 8, dtype=torch.float64)  # one launch on a GPU
            for _ in range(5):  # the first logged steps learn the layouts
                step()
                w.flush()
            sys.settrace(counter.trace)
            counter.on = True
            for _ in range(args.steps):
                step()
            w.flush()  # the writes of these steps, done
            counter.on = False
            sys.settrace(None)
            w.close()
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
        batch.row_stats = row_stats
    steps = args.steps
    training = counter.by_thread["MainThread"] / steps
    writer = sum(n for name, n in counter.by_thread.items() if name != "MainThread") / steps
    path = "as a CPU step" if args.cpu_path else "as a CUDA step (the --host model of watch_gpu.py)"
    print(f"bytecodes per step, {steps} logged steps counted, measured {path}")
    print(f"  plain step:  {plain:,}")
    print(f"  logged step: training thread {training:,.0f} ({training - plain:+,.0f}), writer thread {writer:,.0f}")
    print(f"  the {args.top} functions that run the most (both threads, per step):")
    for where, n in counter.by_function.most_common(args.top):
        print(f"  {n / steps:10,.0f}  {where}")


if __name__ == "__main__":
    main()
