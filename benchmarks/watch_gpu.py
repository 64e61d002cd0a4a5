#!/usr/bin/env python
"""Cost of ``tl.watch`` on a GPU training step, as ratios against a plain training step.

ResNet-18 (torchvision, ``weights=None``), batch 64 at 224x224, SGD with momentum, on CUDA.
Identical copies of the model (one per variant) train on the same batch in one process, taking
turns in blocks of steps, the order turning by one each round:

* ``plain``        -- forward, loss, backward, optimizer step, no watch;
* ``not logged``   -- ``tl.watch(log_freq=1000)``: steps that are not logged;
* ``logged``       -- ``log_freq=1``, the four default kinds (io, io_grad, params, params_grad);
* ``5 kinds``      -- ``log_freq=1`` with ``updates`` too.

Clocks are read after ``torch.cuda.synchronize()``; a watched block ends when its watch has
written what it logged (``flush``), so the writer thread's work counts for that variant. Every
variant first runs warm-up steps (cuDNN's algorithm search, the watch's first logged step, which
traces the module graph and compiles the batched measurement where Triton is present). Ratios
are medians over rounds of each variant's block time against the plain block of the same
round. Also printed: the peak GPU memory of a step of each variant against the plain step's,
and which measuring kernels ran (the Triton kernels of ``measure/kernels.py``, the
``torch.compile``d ``row_stats``, or torch's eager ones).

    python benchmarks/watch_gpu.py [--quick] [--json results.json]

``--measure`` times the measuring path alone, on the host, where no GPU is needed: the tensors
of the three phases of a logged ResNet-18 step at batch 64, 224x224 (the forward's inputs,
outputs and parameters, the gradients, the updates: their shapes found by one watched step at
batch 1 on the CPU, the activations scaled to batch 64) are made 1/``--scale`` as large on the
CPU (the layout's thresholds likewise, so the same tensors are read in place), and
``measure_batch`` is timed over them with its layout kept (a logged step's case) and rebuilt,
with the ATen operations it runs. On the CPU, torch's eager ``row_stats`` runs once per slice
of rows, where a GPU runs one kernel per dtype (kernels.py): the time and the count include it.

    python benchmarks/watch_gpu.py --measure [--scale 4096]

``--host`` measures, on the CPU, the host's work of a logged step where kernels cost almost
nothing, as on a GPU: a ResNet-18 of the same layers at an eighth of the width (8 to 64
channels), batch 2 at 32x32, one thread, the batched path forced (what a CUDA step runs), and
each launch of the Triton kernels that measure a phase on a GPU replaced by one small operation
(``watch_overhead.OneOpKernels``; the tensors are then laid out as for those kernels, and the
numbers are not real: this mode times, it does not check). Printed per step, as
medians over blocks that take turns with a plain step: the training thread's CPU time, the wall
time, and the part of it spent waiting for the writer thread at the end of the optimizer step
(the write a killed process must find in the run), with the default ``durable=True`` and with
``durable=False``. On a GPU the same wait also waits for the step's kernels. A block ends when
its watch has written its steps.

    python benchmarks/watch_gpu.py --host [--rounds 12]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional

import torch
from torch import nn

import torchlens as tl
from torchlens.train.measure import COMPILED
from torchlens.train.measure.kernels import TRITON

VARIANTS = {
    "plain": None,
    "not logged": dict(log_freq=1000),
    "logged": dict(log_freq=1),
    "5 kinds": dict(log_freq=1, log=("io", "io_grad", "params", "params_grad", "updates")),
}


def make_model(device: torch.device) -> nn.Module:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (a check that it runs, not a figure)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of turns (default 12, quick 2)")
    parser.add_argument("--block", type=int, default=None, help="steps per turn (default 10, quick 3)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON to PATH")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself (no figure)")
    parser.add_argument("--measure", action="store_true", help="time the measuring path alone, on the CPU")
    parser.add_argument("--scale", type=int, default=4096, help="--measure: tensors this many times smaller")
    parser.add_argument("--host", action="store_true", help="time a logged step's host work, on the CPU")
    args = parser.parse_args()
    if args.host:
        host_only(args.rounds or 12, args.block or 10, args.json)
        return
    if args.measure:
        measure_only(args.scale, args.json)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("watch_gpu.py needs a CUDA device (torch.cuda.is_available() is False)")
    rounds = args.rounds or (2 if args.quick else 12)
    block = args.block or (3 if args.quick else 10)
    warmup = 3 if args.quick else 10
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = True

    base = make_model(device)
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    models: Dict[str, nn.Module] = {}
    optimizers: Dict[str, torch.optim.Optimizer] = {}
    watches: Dict[str, object] = {}
    folder = tempfile.mkdtemp(prefix="torchlens-watch-gpu-")
    for name, options in VARIANTS.items():
        models[name] = copy.deepcopy(base)
        optimizers[name] = torch.optim.SGD(models[name].parameters(), lr=1e-3, momentum=0.9)
        if options is not None:
            run_dir = f"{folder}/{name.replace(' ', '_')}"
            watches[name] = tl.watch(models[name], run_dir=run_dir, backend=None, verbose=False, **options)

    def step(name: str) -> None:
        model, opt = models[name], optimizers[name]
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def run_block(name: str, steps: int) -> float:
        synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step(name)
        if name in watches:
            watches[name].flush()  # type: ignore[attr-defined]
        synchronize()
        return time.perf_counter() - start

    for name in VARIANTS:  # warm-up
        run_block(name, warmup)

    peaks: Dict[str, float] = {}
    for name in VARIANTS:  # peak memory of one step (the block's writes included)
        synchronize()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        run_block(name, 2)
        peaks[name] = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else float("nan")

    times: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    order = list(VARIANTS)
    for r in range(rounds):
        turn = order[r % len(order) :] + order[: r % len(order)]
        for name in turn:
            times[name].append(run_block(name, block) / block)
    for w in watches.values():
        w.close()  # type: ignore[attr-defined]

    plain_ms = statistics.median(times["plain"]) * 1e3
    result = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu (dry run)",
        "torch": torch.__version__,
        "model": f"resnet18 batch {args.batch} at 224x224, SGD",
        "rounds": rounds,
        "block": block,
        "plain_ms": plain_ms,
        "ms": {name: statistics.median(t) * 1e3 for name, t in times.items()},
        "ratio": {
            name: statistics.median(v / p for v, p in zip(times[name], times["plain"]))
            for name in VARIANTS
            if name != "plain"
        },
        "peak_mib": peaks if cuda else None,
        "peak_ratio": {name: peaks[name] / peaks["plain"] for name in VARIANTS if name != "plain"} if cuda else None,
        "measure_kernels": (
            "Triton (kernels.py: one launch for the rows and one for the samples of each dtype)"
            if TRITON.fns is not None
            else f"compiled row_stats (torch.compile; Triton kernels off: {TRITON.error})"
            if COMPILED.fn is not None
            else f"eager ({COMPILED.error or TRITON.error or 'the kernels are for CUDA tensors'})"
        ),
    }
    print(f"{result['device']}, torch {result['torch']}, {result['model']}, {rounds} rounds of {block} steps")
    print(f"  plain step: {plain_ms:.1f} ms, peak {peaks['plain']:.0f} MiB")
    for name in VARIANTS:
        if name == "plain":
            continue
        print(
            f"  {name:<11} {result['ms'][name]:7.1f} ms  {result['ratio'][name]:.3f}x"
            f"   peak {peaks[name]:.0f} MiB ({peaks[name] / peaks['plain']:.3f}x)"
        )
    print(f"  measuring kernels: {result['measure_kernels']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


def phase_shapes() -> List[List[torch.Size]]:
    """The shapes of the tensors measured in each phase of a logged ResNet-18 step (batch 1 on
    the CPU, the batched path forced), the activations' at batch 64 and 224x224."""
    import torchvision

    from torchlens.train.measure import phase

    seen: List[List[torch.Size]] = []
    measure = phase.measure_batch

    def record(tensors, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append([t.shape for t in tensors])
        return measure(tensors, *args, **kwargs)

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    folder = tempfile.mkdtemp(prefix="torchlens-watch-measure-")
    w = tl.watch(model, run_dir=folder, backend=None, verbose=False, log=VARIANTS_5)
    w.recorder.batch_devices = frozenset({"cpu"})  # the batched path, on the CPU
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    phase.measure_batch = record
    try:
        for _ in range(2):
            seen.clear()
            loss = nn.functional.cross_entropy(model(torch.randn(1, 3, 224, 224)), torch.tensor([3]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        phase.measure_batch = measure
        w.close()
    # an activation has the batch first (1 here); a parameter never has a first dimension of 1
    return [[torch.Size([64, *s[1:]]) if len(s) >= 2 and s[0] == 1 else s for s in shapes] for shapes in seen]


def measure_only(scale: int, json_path: object) -> None:
    """Host time of ``measure_batch`` over a logged ResNet-18 step's phases (see the module)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchlens.train.measure import LayoutCache, batch, layout, measure_batch

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops += 0 if func.is_view else 1
            return func(*args, **(kwargs or {}))

    shapes = phase_shapes()
    torch.set_num_threads(1)
    phases = [[torch.randn(max(1, s.numel() // scale)) for s in p] for p in shapes]
    layout.BIG, layout.CHUNK = max(layout.BLOCK, layout.BIG // scale), max(layout.BLOCK, layout.CHUNK // scale)
    # "whole": each source read by one row_stats call, as a GPU's compiled fallback does
    variants = {
        "layout kept": (LayoutCache(), False),
        "layout rebuilt": (None, False),
        "kept, whole": (LayoutCache(), True),
        "rebuilt, whole": (None, True),
    }
    result: Dict[str, object] = {"tensors": [len(p) for p in phases], "scale": scale}
    compiled = batch._compiled
    for name, (kept, whole) in variants.items():
        batch._compiled = (lambda keys: True) if whole else compiled  # type: ignore[assignment]

        def step(kept: object = kept) -> None:
            for tensors in phases:
                measure_batch(tensors, 1000, lambda d: None, kept)  # type: ignore[arg-type]

        for _ in range(3):
            step()
        with Count() as count:
            step()
        times = []
        for _ in range(30):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        result[name] = {"ms": statistics.median(times) * 1e3, "aten_ops": count.ops}
        print(f"{name:<15} {statistics.median(times) * 1e3:6.2f} ms a step (median)  {count.ops} ATen ops")
    batch._compiled = compiled
    print(f"tensors per phase {result['tensors']}, values 1/{scale} of batch 64 at 224x224, one thread")
    if json_path:
        with open(str(json_path), "w") as f:
            json.dump(result, f, indent=2)


VARIANTS_5 = ("io", "io_grad", "params", "params_grad", "updates")


class _Block(nn.Module):
    """torchvision's BasicBlock (two 3x3 convolutions, the residual added in place)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: Optional[nn.Module] = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        out += identity
        return self.relu(out)


def narrow_resnet18(width: int = 8, classes: int = 10) -> nn.Module:
    """ResNet-18's layers (62 modules, the same series) at ``width`` channels in its first stage."""
    stages, cin = [], width
    for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
        stages.append(nn.Sequential(_Block(cin, cout, 1 if i == 0 else 2), _Block(cout, cout, 1)))
        cin = cout
    return nn.Sequential(
        nn.Conv2d(3, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        *stages,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(cin, classes),
    )


def host_only(rounds: int, block: int, json_path: object) -> None:
    """The host's work of a logged step, on the CPU (see ``--host`` in the module)."""
    from watch_overhead import OneOpKernels  # beside this script

    from torchlens.train.measure import batch
    from torchlens.train.step import writer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = narrow_resnet18()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    variants = {"logged": {}, "not durable": {"durable": False}}
    models = {name: copy.deepcopy(base) for name in ("plain", *variants)}
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for k, m in models.items()}
    folder = tempfile.mkdtemp(prefix="torchlens-host-")
    watches = []
    for i, (name, options) in enumerate(variants.items()):
        w = tl.watch(models[name], run_dir=f"{folder}/{i}", backend=None, verbose=False, **options)
        w.recorder.batch_devices = frozenset({"cpu"})  # what a CUDA step runs
        watches.append(w)
    kernels = batch.TRITON
    batch.TRITON = OneOpKernels()  # a GPU's Triton kernels: one small operation per launch
    waited = [0.0]
    durable = writer.StepWriter.durable

    def timed_durable(self: object) -> None:
        start = time.perf_counter()
        durable(self)  # type: ignore[arg-type]
        waited[0] += time.perf_counter() - start

    writer.StepWriter.durable = timed_durable  # type: ignore[assignment]

    def run_block(name: str, steps: int) -> tuple:
        model, opt = models[name], optimizers[name]
        waited[0] = 0.0
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        for w in watches:  # a block ends with its writes done: they count for the variant that made them
            w.flush()
        return (time.thread_time() - cpu) / steps, (time.perf_counter() - wall) / steps, waited[0] / steps

    try:
        for name in models:
            run_block(name, 5)
        found: Dict[str, List[tuple]] = {name: [] for name in models}
        names = list(models)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                found[name].append(run_block(name, block))
    finally:
        writer.StepWriter.durable = durable  # type: ignore[assignment]
        batch.TRITON = kernels
        for w in watches:
            w.close()
    med = {name: [statistics.median(v[i] for v in found[name]) * 1e3 for i in range(3)] for name in models}
    fields = ("thread_ms", "wall_ms", "durable_wait_ms")
    result: Dict[str, object] = {
        "model": "ResNet-18 layers at 8-64 channels, batch 2 at 32x32, the batched path on the CPU",
        "series": len(tl.open_run(watches[0].run_dir).series_names()),
        **{name: dict(zip(fields, med[name])) for name in models},
        "ratio": {
            name: statistics.median(v[1] / p[1] for v, p in zip(found[name], found["plain"])) for name in variants
        },
    }
    print(result["model"], f"({result['series']} series), {rounds} rounds of {block} steps")
    print(f"  plain step:  training thread {med['plain'][0]:.2f} ms, wall {med['plain'][1]:.2f} ms")
    for name in variants:
        print(
            f"  {name + ':':<12} training thread {med[name][0]:.2f} ms, wall {med[name][1]:.2f} ms "
            f"({result['ratio'][name]:.2f}x), of which waiting for the write {med[name][2]:.2f} ms"  # type: ignore[index]
        )
    if json_path:
        with open(str(json_path), "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
