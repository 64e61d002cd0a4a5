#!/usr/bin/env python
"""Cost of ``tl.watch`` on a training step, as ratios against a plain training step.

For each model, identical copies (one per variant) train on the same batches in one process,
taking turns in blocks of steps so that all of them see the same machine:

* ``plain``      -- a training step (forward, loss, backward, SGD step) without watch;
* ``not logged`` -- with ``tl.watch(log_freq=100)``: steps that are not logged;
* ``logged``     -- with ``tl.watch(log_freq=1)`` and all four kinds: every step is logged
                    (its samples and exact statistics taken by the hooks, its histograms
                    binned and written by the watch's writer thread while training goes on);
* ``input grads`` -- the same with ``input_grads=True``: the data also gets gradient strips,
                    through an alias that requires grad; the extra backward work of the
                    data's gradient is the difference between the two;
* ``not durable``  -- ``log_freq=1`` with ``durable=False``: the optimizer step does not wait
                    for the step's write (a killed process may lose the last logged steps);
* ``5 kinds logged`` -- ``log_freq=1`` with the fifth kind, ``updates`` (the parameters copied
                    before each optimizer step, their change recorded after it);
* ``5 input grads`` -- the same with ``input_grads=True``;
* ``5 not logged`` -- ``log_freq=100`` with all five kinds: steps that are not logged.

With ``--per-kind``, the variants are instead ``io only``, ``io_grad only``, ... (``log_freq=1``
with that one kind): what each kind adds, each also paying the hooks all kinds share.

The variants take turns in blocks of ``--block`` steps; a watched block ends when its watch
has written what it logged (``flush``), so the writer thread's work counts for that variant, not
for the plain steps beside it. Ratios are medians over rounds of each variant's block against the
plain block of the same round. With
``--cpu-time``, the training thread's CPU time is compared instead (``time.thread_time``): the
work the watch adds to training itself, less disturbed by other processes on a shared machine,
and leaving out the writer thread's work (which a second core takes in the wall-time figures). Models: ResNet-18
(batch 16, 64x64) and a 4-layer GPT-2 (batch 8, 64 tokens, with ``attention_mask``).

With ``--ops``, no timing: the number of ATen operations of one plain step and what a logged
step (four kinds) adds to it, on every thread (the writer thread's too), as ``torch.profiler``
counts them on the CPU, for two MLPs (10 and 200 modules of width 64) and ResNet-18: what the
watch launches per watched tensor, which on a GPU is what its cost grows with. Each model is
counted twice: measured as a CPU step measures (``cpu``) and as a CUDA step does (``cuda``).
The last column is what the logged step adds on the training thread alone: on a GPU, the
launches and views that hold up the step (the writer thread's views are host work beside it).

With ``--backends``, ResNet-18's logged step is also measured with each backend: the run
database alone, ``tensorboard`` and ``wandb`` (offline: nothing leaves the machine), as ratios
against the plain step of the same run.
Torch runs on one thread (a 2-thread pool stalls when another process holds a core).

    .venv/bin/python benchmarks/watch_overhead.py [--steps 40] [--models resnet18,gpt2]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

import torchlens as tl
from torchlens.train.measure.kernels import Kernels


def resnet18():
    import torchvision

    model = torchvision.models.resnet18(weights=None, num_classes=10)
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))

    def step(m: nn.Module) -> torch.Tensor:
        return nn.functional.cross_entropy(m(x), y)

    return model, step


def gpt2():
    import transformers

    config = transformers.GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=5000, n_positions=128, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 5000, (8, 64))
    mask = torch.ones(8, 64, dtype=torch.long)
    mask[:, 56:] = 0

    def step(m: nn.Module) -> torch.Tensor:
        return m(input_ids=ids, attention_mask=mask, labels=ids).loss

    return model, step


MODELS: Dict[str, Callable] = {"resnet18": resnet18, "gpt2": gpt2}


def mlp(modules: int) -> tuple:
    """An MLP of ``modules`` modules (Linear(64, 64) and ReLU in turn), batch 8."""
    model = nn.Sequential(*[m for _ in range(modules // 2) for m in (nn.Linear(64, 64), nn.ReLU())])
    x = torch.randn(8, 64)

    def step(m: nn.Module) -> torch.Tensor:
        return m(x).pow(2).mean()

    return model, step


# operations that only name memory (no kernel runs on a GPU)
VIEWS = frozenset(
    "aten::" + name
    for name in (
        "detach view view_as reshape _reshape_alias t transpose permute expand unsqueeze squeeze "
        "select slice split split_with_sizes unbind as_strided alias narrow flatten unflatten"
    ).split()
)


def aten_ops(run: Callable[[], None]) -> Tuple[int, int, int]:
    """ATen operations ``run`` performs, on every thread (nested ones included): all of them,
    those that compute (views aside), and all of those on the calling (training) thread."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile, record_function

    config = _ExperimentalConfig(profile_all_threads=True)  # the writer thread's work counts
    with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
        with record_function("training thread"):
            run()
    events = prof.events()
    training = next(e.thread for e in events if e.name == "training thread")
    names = [(e.name, e.thread) for e in events if e.name.startswith("aten::")]
    return (
        len(names),
        sum(name not in VIEWS for name, _ in names),
        sum(thread == training for _, thread in names),
    )


class OneOpKernels(Kernels):
    """The measuring kernels as a CUDA step launches them, on the CPU: each launch one
    operation (a zero fill of its output), so that ``--ops`` counts what a GPU runs."""

    def applies(self, device: torch.device) -> bool:
        return True

    def get(self) -> tuple:
        return ()

    def rows(self, ptrs: torch.Tensor, rows: Tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(rows[0].numel(), 8, dtype=torch.float64).zero_()

    def merge(self, stats: torch.Tensor, runs: torch.Tensor, numel: torch.Tensor, pads: torch.Tensor) -> torch.Tensor:
        return torch.empty(numel.numel(), 10, dtype=torch.float64).zero_()

    def gather(self, ptrs: torch.Tensor, index: tuple, out: torch.Tensor, dtype: torch.dtype) -> bool:
        out.zero_()
        return True


def step_ops(make: Callable, batched: bool = False) -> Tuple[int, Tuple[int, ...], Tuple[int, ...]]:
    """The series of a logged step of the model ``make`` builds, the ATen operations of its
    plain step, and those of its logged step (four kinds): all, and views aside. ``batched``:
    the step's tensors measured as a CUDA step measures them (together at each phase's end, on
    the training thread) rather than as a CPU step does (copied, measured on the writer thread)."""
    from torchlens.train.measure import batch as measure_batch

    torch.manual_seed(0)
    model, loss_of = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        loss = loss_of(model)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    plain = aten_ops(step)
    kernels = measure_batch.TRITON
    if batched:  # a GPU runs the Triton kernels: one operation stands for each launch
        measure_batch.TRITON = OneOpKernels()
    with tempfile.TemporaryDirectory() as folder:
        try:
            w = tl.watch(model, run_dir=folder, backend=None, verbose=False, log_freq=1)
            if batched:
                w.recorder.batch_devices = frozenset({"cpu"})
            for _ in range(2):  # the first logged steps learn the layouts and build the graph
                step()
                w.flush()
            logged = aten_ops(lambda: (step(), w.flush()))
            w.close()
        finally:
            measure_batch.TRITON = kernels
        run = tl.open_run(folder)
        series = len(run.series_names())
        run.close()
    return series, plain, logged


def count_ops() -> None:
    """Print the ATen operations of a plain step and those a logged step adds."""
    print("ATen operations, on every thread; in brackets, views aside (no kernel on a GPU)")
    print("path: 'cpu' as a CPU step measures; 'cuda' as a CUDA step does, run here on the CPU (each")
    print("      launch of a measuring Triton kernel counted as one operation, its values not computed)")
    print("last column: what a logged step adds on the training thread alone (a GPU step's launches)")
    print(f"{'model':<10} {'path':<5} {'series':>7} {'plain step':>18} {'a logged step adds':>19} {'training':>9}")
    for name, make in (("mlp-10", lambda: mlp(10)), ("mlp-200", lambda: mlp(200)), ("resnet18", resnet18)):
        for path in ("cpu", "cuda"):
            series, plain, logged = step_ops(make, batched=path == "cuda")
            added = f"{logged[0] - plain[0]} ({logged[1] - plain[1]})"
            row = f"{name:<10} {path:<5} {series:>7} {f'{plain[0]} ({plain[1]})':>18} {added:>19}"
            print(f"{row} {logged[2] - plain[2]:>9}")


CLOCK = time.perf_counter


def interleaved_steps(
    variants: Dict[str, nn.Module], loss_of: Callable, steps: int, watches: Dict[str, "tl.Watch"], block: int
) -> Dict[str, List[float]]:
    """Seconds per training step of each variant: the variants take turns in blocks of
    ``block`` steps, in an order that turns by one each round, and a watched block ends when its
    watch has written its steps (``flush``).
    The writer thread's work thus counts for the variant that caused it, not for the plain steps
    that would otherwise run beside it (on a machine whose cores share caches and memory
    bandwidth, that work slows whatever runs at the same time)."""
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in variants.items()}
    times: Dict[str, List[float]] = {k: [] for k in variants}
    rounds = max(1, -(-steps // block))
    keys = list(variants)
    for i in range(rounds + 1):
        # the order turns each round: with a fixed one, which variant came next mattered (two
        # variants swapped moved both ratios by 0.04-0.08), so no variant always follows another
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
            model = variants[key]
            start = CLOCK()
            for _ in range(block if i else 3):  # round 0: warm-up, and the one-off graph trace
                loss = loss_of(model)
                optimizers[key].zero_grad()
                loss.backward()
                optimizers[key].step()
            if key in watches:
                watches[key].flush()
            if i:
                times[key].append((CLOCK() - start) / block)
    return times


FIVE = ("io", "io_grad", "params", "params_grad", "updates")
# each watched variant: its tl.watch options
VARIANTS: Dict[str, Dict] = {
    "not logged": dict(log_freq=100),
    "logged": dict(log_freq=1),
    "input grads": dict(log_freq=1, input_grads=True),
    "not durable": dict(log_freq=1, durable=False),
    "5 kinds logged": dict(log=FIVE),
    "5 input grads": dict(log=FIVE, input_grads=True),
    "5 not logged": dict(log=FIVE, log_freq=100),
}
# one kind logged at a time (``--per-kind``): what each adds, the shared hooks counted in each
PER_KIND: Dict[str, Dict] = {f"{kind} only": dict(log=(kind,)) for kind in FIVE}
VARIANTS.update(PER_KIND)


def measure(name: str, steps: int, chosen: List[str], block: int) -> Dict[str, float]:
    torch.manual_seed(0)
    base, loss_of = MODELS[name]()
    variants = {k: copy.deepcopy(base) for k in ["plain", *chosen]}
    folder = tempfile.mkdtemp()
    watches = {
        k: tl.watch(variants[k], run_dir=f"{folder}/{i}", backend=None, verbose=False, **VARIANTS[k])
        for i, k in enumerate(chosen)
    }
    times = interleaved_steps(variants, loss_of, steps, watches, block)
    for w in watches.values():
        w.close()
    result = {"plain_ms": statistics.median(times["plain"]) * 1e3}
    for key in chosen:
        result[key] = paired_ratio(times[key], times["plain"])
    return result


def paired_ratio(variant: List[float], plain: List[float]) -> float:
    """The median over rounds of a variant's block against the plain block of the same round:
    the machine's speed drifts over minutes, and a round's blocks run close together."""
    return statistics.median(v / p for v, p in zip(variant, plain))


def measure_backends(steps: int, block: int) -> Dict[str, float]:
    import os

    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    torch.manual_seed(0)
    base, loss_of = resnet18()
    folder = tempfile.mkdtemp()
    wandb.init(project="torchlens-bench", dir=folder)
    names = {"plain": None, "database only": None, "tensorboard": "tensorboard", "wandb": "wandb"}
    variants = {k: copy.deepcopy(base) for k in names}
    watches = {
        k: tl.watch(variants[k], log_freq=1, run_dir=f"{folder}/{i}", backend=b, verbose=False)
        for i, (k, b) in enumerate(names.items())
        if k != "plain"
    }
    times = interleaved_steps(variants, loss_of, steps, watches, block)
    for w in watches.values():
        w.close()
    wandb.finish()
    return {k: paired_ratio(v, times["plain"]) for k, v in times.items() if k != "plain"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--models", default="resnet18,gpt2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--block", type=int, default=10, help="steps per turn of each variant")
    parser.add_argument("--backends", action="store_true", help="also time each backend's logged step")
    parser.add_argument("--ops", action="store_true", help="count ATen operations instead of timing steps")
    parser.add_argument("--cpu-time", action="store_true", help="the training thread's CPU time, not wall time")
    parser.add_argument("--per-kind", action="store_true", help="time each kind logged alone (and nothing else)")
    parser.add_argument(
        "--variants",
        default="",
        help="comma-separated variants to time against plain (default: all); each watch's writer thread "
        "also runs while the other variants are timed, so one variant alone is the cleanest figure",
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.thread_time
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.ops:
        count_ops()
        return
    clock = "training thread's CPU time" if args.cpu_time else "wall time"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.steps} timed steps per variant, {clock}"
    )
    default = list(PER_KIND) if args.per_kind else [k for k in VARIANTS if k not in PER_KIND]
    chosen = [v.strip() for v in args.variants.split(",")] if args.variants else default
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose among {list(VARIANTS)}")
    print(f"{'model':<10} {'plain step':>11} " + " ".join(f"{k:>{max(len(k), 7)}}" for k in chosen))
    for name in args.models.split(","):
        try:
            r = measure(name, args.steps, chosen, args.block)
        except ImportError as error:
            print(f"{name:<10} skipped ({error})", file=sys.stderr)
            continue
        cells = " ".join(f"{r[k]:>{max(len(k), 7) - 1}.3f}x" for k in chosen)
        print(f"{name:<10} {r['plain_ms']:>9.1f}ms {cells}")
    if args.backends:
        print("\nResNet-18, logged step (log_freq=1) per backend, against a plain step:")
        for key, ratio in measure_backends(args.steps, args.block).items():
            print(f"  {key:<14} {ratio:.3f}x")


if __name__ == "__main__":
    main()
