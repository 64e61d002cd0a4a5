#!/usr/bin/env python
"""Overhead of torchlens compared with a plain PyTorch forward pass.

What it measures
----------------
For each model below, in one process and on the CPU:

* ``plain``     -- median wall time of ``model(*args, **kwargs)`` with autograd
                   enabled (``torch.enable_grad()``), model in eval mode;
* ``torchlens`` -- median wall time of
                   ``torchlens.log_forward_pass(model, ..., layers_to_save='all')``;
* ``ratio``     -- torchlens median / plain median;
* ``loop ratio`` -- the same, timed right after another ``log_forward_pass``
                   (as in a loop of them; see below);
* ``metadata ratio`` -- median of ``get_model_metadata`` (nothing saved) / plain median;
* ``ops``       -- number of logged operations, ``len(history)``;
* ``first``     -- wall time of the very first torchlens call for that model
                   (includes any one-off setup; not part of the medians).

Models:

a) tiny MLP: Linear(10, 20) -> ReLU -> Linear(20, 5), input (4, 10);
b) torchvision ResNet-18 (``weights=None``), input (1, 3, 224, 224);
c) GPT-2 (12 layers, ``GPT2LMHeadModel(GPT2Config())``, random weights),
   ``input_ids`` of shape (1, 128). Skipped with a message when
   ``transformers`` is not installed (``pip install -e '.[bench]'``).

After a warm-up, rounds of plain, torchlens and metadata calls follow each
other so that all see the same machine conditions; only the ratios are
meaningful on a noisy machine, absolute times are indicative. ``ratio`` times
``log_forward_pass`` right after a plain forward; ``loop ratio`` right after
another ``log_forward_pass``, whose history was just released: glibc returns
that memory to the OS, and the next call faults it in again (page faults, not
torchlens's work: with ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``
set high the two ratios agree). The collector is left to run as in a training
script (a ``gc.collect()`` per round leaves caches and free lists cold). The
``first call`` column shows a cold call.
By default torch runs single-threaded (``--threads 1``): on a small shared
machine (2 cores) a 2-thread OpenMP pool stalls for milliseconds per kernel
whenever another process holds a core, which inflates the plain forward and
hides the overhead. ``--threads 0`` keeps torch's default.

It also measures the import cost of torchlens on top of torch: the median
(over 5 alternating runs) of ``python -c "import torch, torchlens"`` minus the
median of ``python -c "import torch"``, each in a fresh subprocess, and (less
noisy) the median time of ``import torchlens`` in a fresh process that has
already imported torch.

How to run
----------
    make bench                      # full run (needs the venv: make venv)
    make bench BENCH_ARGS=--quick   # fewer repeats
    .venv/bin/python benchmarks/overhead.py [--quick] [--models mlp,resnet18,gpt2]
                                            [--threads N] [--json results.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional

# Never reach for a model hub: everything here is built from configs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import torchlens as tl  # noqa: E402

# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------


@dataclass
class Case:
    """A model plus the inputs for both the plain call and torchlens."""

    name: str
    model: nn.Module
    args: List[Any]
    kwargs: Dict[str, Any]
    tl_input_args: Any  # what is passed as torchlens' input_args
    repeats: int


@dataclass
class Result:
    name: str
    repeats: int = 0
    plain_s: List[float] = field(default_factory=list)
    tl_s: List[float] = field(default_factory=list)
    meta_s: List[float] = field(default_factory=list)  # get_model_metadata
    loop_s: List[float] = field(default_factory=list)  # log_forward_pass after log_forward_pass
    first_tl_s: Optional[float] = None
    ops: Optional[int] = None
    skipped: Optional[str] = None
    error: Optional[str] = None

    @property
    def plain_med(self) -> Optional[float]:
        return statistics.median(self.plain_s) if self.plain_s else None

    @property
    def tl_med(self) -> Optional[float]:
        return statistics.median(self.tl_s) if self.tl_s else None

    @property
    def ratio(self) -> Optional[float]:
        if self.plain_med and self.tl_med:
            return self.tl_med / self.plain_med
        return None

    @property
    def loop_ratio(self) -> Optional[float]:
        if self.plain_med and self.loop_s:
            return statistics.median(self.loop_s) / self.plain_med
        return None

    @property
    def meta_ratio(self) -> Optional[float]:
        if self.plain_med and self.meta_s:
            return statistics.median(self.meta_s) / self.plain_med
        return None


def make_mlp(repeats: int) -> Case:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5)).eval()
    x = torch.randn(4, 10)
    return Case("MLP (4x10)", model, [x], {}, x, repeats)


def make_resnet18(repeats: int) -> Case:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    return Case("ResNet-18 (1x3x224x224)", model, [x], {}, x, repeats)


def make_gpt2(repeats: int) -> Case:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config()  # 12 layers, 768 hidden, vocab 50257
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 128))
    return Case("GPT-2 12L (ids 1x128)", model, [], {"input_ids": ids}, [], repeats)


def transformers_available() -> bool:
    try:
        import transformers  # noqa: F401
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> "tuple[float, Any]":
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _count_ops(history: Any) -> Optional[int]:
    try:
        return len(history)
    except TypeError:
        return None


def bench_case(case: Case, warmup: int) -> Result:
    res = Result(case.name, repeats=case.repeats)
    model = case.model

    def plain():
        with torch.enable_grad():
            return model(*case.args, **case.kwargs)

    def logged():
        return tl.log_forward_pass(
            model,
            case.tl_input_args,
            input_kwargs=case.kwargs or None,
            layers_to_save="all",
        )

    def metadata():
        return tl.get_model_metadata(model, case.tl_input_args, input_kwargs=case.kwargs or None)

    try:
        for _ in range(warmup):
            plain()
        res.first_tl_s, history = _timed(logged)
        res.ops = _count_ops(history)
        del history
        for _ in range(max(0, warmup - 1)):
            del_me = logged()
            del del_me
        gc.collect()

        for _ in range(case.repeats):
            # A call that follows the release of a history pays for fresh pages: glibc hands the
            # freed memory back to the OS, and faulting it in again costs about 15-30 ms on
            # ResNet-18 here. So log_forward_pass is timed twice per round: right after a plain
            # forward (``ratio``) and right after another log_forward_pass (``loop ratio``); the
            # others each after an untimed call of their own kind.
            for kind, fn in (("plain", plain), ("logged", logged), ("loop", logged), ("metadata", metadata)):
                if kind in ("plain", "metadata"):
                    del_me = fn()
                    del del_me
                t, out = _timed(fn)
                ops = _count_ops(out) if kind == "logged" else None
                if ops is not None:
                    res.ops = ops
                del out  # freed here: a history holds no reference cycles
                {"plain": res.plain_s, "logged": res.tl_s, "loop": res.loop_s, "metadata": res.meta_s}[kind].append(t)
    except Exception as exc:  # keep going with the other models
        res.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    return res


def import_overhead(repeats: int = 5) -> Dict[str, float]:
    """Median wall time of `import torch` vs `import torch, torchlens`."""

    def run(stmt: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", stmt], check=True)
        return time.perf_counter() - t0

    # Less noisy: time `import torchlens` inside a process that already has torch.
    inner = "import time, torch; t0 = time.perf_counter(); import torchlens; print(time.perf_counter() - t0)"

    run("import torch, torchlens")  # warm the OS file cache
    base, with_tl, direct = [], [], []
    for _ in range(repeats):
        base.append(run("import torch"))
        with_tl.append(run("import torch, torchlens"))
        out = subprocess.run([sys.executable, "-c", inner], check=True, capture_output=True, text=True).stdout
        direct.append(float(out.strip().splitlines()[-1]))
    b, w = statistics.median(base), statistics.median(with_tl)
    return {
        "import_torch_s": b,
        "import_torch_torchlens_s": w,
        "torchlens_extra_s": w - b,
        "torchlens_after_torch_s": statistics.median(direct),
    }


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def _fmt_ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.2f}"


def print_table(results: List[Result]) -> None:
    headers = [
        "model",
        "ops",
        "plain ms",
        "torchlens ms",
        "ratio",
        "loop ratio",
        "metadata ratio",
        "first call ms",
        "n",
    ]
    rows = []
    notes = []
    for r in results:
        if r.skipped:
            rows.append([r.name, "-", "-", "-", "skipped", "-", "-", "-", "-"])
            notes.append(f"{r.name}: skipped ({r.skipped})")
            continue
        if r.error and not r.tl_s:
            rows.append([r.name, "-", _fmt_ms(r.plain_med), "-", "error", "-", "-", "-", "-"])
            notes.append(f"{r.name}: {r.error}")
            continue
        rows.append(
            [
                r.name,
                "?" if r.ops is None else str(r.ops),
                _fmt_ms(r.plain_med),
                _fmt_ms(r.tl_med),
                "-" if r.ratio is None else f"{r.ratio:,.2f}x",
                "-" if r.loop_ratio is None else f"{r.loop_ratio:,.2f}x",
                "-" if r.meta_ratio is None else f"{r.meta_ratio:,.2f}x",
                _fmt_ms(r.first_tl_s),
                str(len(r.tl_s)),
            ]
        )
        if r.error:
            notes.append(f"{r.name}: stopped early: {r.error}")

    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: List[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest])

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    for n in notes:
        print(f"  note: {n}")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

MODEL_CHOICES = ("mlp", "resnet18", "gpt2")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument(
        "--models",
        default=",".join(MODEL_CHOICES),
        help=f"comma-separated subset of {','.join(MODEL_CHOICES)} (default: all)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1; 0 = leave torch's default)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--no-import-time", action="store_true", help="skip the import-time measurement")
    opts = parser.parse_args(argv)

    models = [m.strip() for m in opts.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(MODEL_CHOICES))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")

    if opts.threads > 0:
        torch.set_num_threads(opts.threads)

    if opts.quick:
        reps = {"mlp": 7, "resnet18": 3, "gpt2": 3}
        warmup = 1
    else:
        reps = {"mlp": 25, "resnet18": 7, "gpt2": 7}
        warmup = 2

    print(
        f"torchlens overhead benchmark -- python {platform.python_version()}, "
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, "
        f"{'quick' if opts.quick else 'full'} run"
    )
    print(
        "plain = model(...) with grad enabled; torchlens = log_forward_pass(..., "
        "layers_to_save='all'); medians of alternating runs\n"
    )

    builders = {"mlp": make_mlp, "resnet18": make_resnet18, "gpt2": make_gpt2}
    results: List[Result] = []
    for key in models:
        if key == "gpt2" and not transformers_available():
            r = Result("GPT-2 12L (ids 1x128)")
            r.skipped = "transformers is not installed; pip install -e '.[bench]'"
            print(f"[{key}] SKIPPED: {r.skipped}", flush=True)
            results.append(r)
            continue
        print(f"[{key}] building model ...", flush=True)
        try:
            case = builders[key](reps[key])
        except Exception as exc:
            traceback.print_exc()
            r = Result(key)
            r.error = f"could not build model: {type(exc).__name__}: {exc}"
            results.append(r)
            continue
        t0 = time.perf_counter()
        res = bench_case(case, warmup)
        print(f"[{key}] done in {time.perf_counter() - t0:.1f} s", flush=True)
        results.append(res)
        del case
        gc.collect()

    print()
    print_table(results)

    mlp = next((r for r in results if r.name.startswith("MLP") and r.tl_s), None)
    if mlp is not None:
        print(
            f"\nMLP: {mlp.tl_med * 1e3:.2f} ms per log_forward_pass call (plain forward {mlp.plain_med * 1e3:.3f} ms)"
        )

    imp = None
    if not opts.no_import_time:
        try:
            imp = import_overhead(5)
            print(
                f"import: torch {imp['import_torch_s'] * 1e3:.0f} ms, "
                f"torch+torchlens {imp['import_torch_torchlens_s'] * 1e3:.0f} ms "
                f"-> torchlens adds {imp['torchlens_extra_s'] * 1e3:.0f} ms (medians of 5); "
                f"`import torchlens` after torch: {imp['torchlens_after_torch_s'] * 1e3:.1f} ms"
            )
        except Exception as exc:
            print(f"import: measurement failed: {type(exc).__name__}: {exc}")

    if opts.json:
        payload = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "quick": opts.quick,
            "models": [
                {
                    **asdict(r),
                    "plain_median_s": r.plain_med,
                    "tl_median_s": r.tl_med,
                    "ratio": r.ratio,
                    "loop_ratio": r.loop_ratio,
                    "metadata_ratio": r.meta_ratio,
                }
                for r in results
            ],
            "import": imp,
        }
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w") as fh:
            json.dump(payload, fh, indent=2)
        print(f"results written to {opts.json}")

    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
