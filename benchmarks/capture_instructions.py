#!/usr/bin/env python
"""Instructions a trace adds per operation, counted by valgrind's callgrind: the same on every run.

On a shared machine the time of one trace swings by a third from run to run, more than most
changes to the tracer's Python move it, so two versions of the tracer are hard to compare by
time. The instructions the CPU runs for a pass do not swing: run twice, this script prints the
same figures to the last few digits. It counts:

* a plain forward of the model,
* a ``log_forward_pass`` saving everything, and one saving nothing (``layers_to_save=None``),

each repeated ``--calls`` times, and prints instructions per call, the ratio to the plain forward
and what the trace adds per logged operation. It also counts the part of a trace that does not
depend on the operations: a trace of a module that holds the model (all its modules, parameters
and buffers) but whose forward is one addition (``fixed``). The models are those of ``capture_per_op.py``
(ResNet-18 on 1x3x32x32, a GPT-2 of 12 layers at width 64 on 8 tokens), whose kernels are cheap,
so the tracer's own work is most of what is counted.

The script starts itself again under ``valgrind --tool=callgrind --instr-atstart=no``: imports
and model building run uncounted (valgrind's simulation is still about 50 times slower than the
CPU: a minute or two in all), and the child switches counting on and off around each measured
loop with ``callgrind_control``. Automatic garbage collection is off while it counts, because the
collector's work comes in lumps that land in one loop or another (``capture_per_op.py`` measures
the collector). Instructions are not time (a kernel's vector instructions do more work each than
the tracer's), so compare these figures with each other, before and after a change.

    python benchmarks/capture_instructions.py [--calls 3] [--heap 2000000]

``--heap N`` also counts the first model's trace after ``gc.freeze()`` and N more live objects
(the heap check of ``capture_per_op.py``, without its noise): a pass that walked the heap would
count many times more.

Needs ``valgrind`` (Debian: ``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List

from torch.nn import Module

MODES = ("plain", "all", "none", "fixed")


class _Holds(Module):
    """Holds a model without running it: its trace is what a trace costs whatever the model does."""

    def __init__(self, model: Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Any) -> Any:
        return x + 1


def _runs(model: Module, x: Any) -> Dict[str, Callable[[], Any]]:
    """The calls counted for one model, by mode."""
    import torch

    import torchlens as tl

    holder, one = _Holds(model), torch.ones(1)
    return {
        "plain": lambda: model(x),
        "all": lambda: tl.log_forward_pass(model, x),
        "none": lambda: tl.log_forward_pass(model, x, layers_to_save=None),
        "fixed": lambda: tl.log_forward_pass(holder, one),
    }


def child(calls: int, heap: int) -> None:
    """Under callgrind: build the models, then count each mode's loop on its own; with ``heap``,
    the first model's trace again after ``gc.freeze()`` and that many more live objects."""
    import torch

    import torchlens as tl
    from torchlens.trace.capture import automatic_collection_paused

    sys.path.insert(0, str(Path(__file__).parent))
    from capture_per_op import models

    torch.set_num_threads(1)
    found = models()

    def control(*request: str) -> None:
        subprocess.run(["callgrind_control", *request, str(os.getpid())], check=True, capture_output=True)

    def count(loops: Dict[str, Callable[[], Any]]) -> None:
        """Each loop's ``calls`` calls counted on their own, as a dump of the loop's name."""
        control("--instr=on")
        try:
            with automatic_collection_paused():
                for dump, run in loops.items():
                    gc.collect()
                    control("--zero")
                    for _ in range(calls):
                        run()
                    control(f"--dump={dump}")
        finally:
            control("--instr=off")

    for index, (name, (model, x)) in enumerate(found.items()):
        runs = _runs(model, x)
        ops = len(tl.log_forward_pass(model, x, layers_to_save=None))
        for run in runs.values():  # warm: caches, wrappers, the interpreter's specialisations
            run()
        print(f"model {index} ops {ops} name {name}", flush=True)
        count({f"m{index}-{mode}": run for mode, run in runs.items()})
    if heap:
        gc.freeze()
        ballast = [[i] for i in range(heap)]
        try:
            count({"heap": _runs(*next(iter(found.values())))["all"]})
        finally:
            del ballast
            gc.unfreeze()


def counts(folder: Path) -> Dict[str, int]:
    """Instructions per dump, by the dump's name (``m0-plain``)."""
    found: Dict[str, int] = {}
    for path in folder.glob("callgrind.out.*"):
        text = path.read_text(errors="replace")
        reason = re.search(r"^desc: Trigger: dump (\S+)", text, re.M)
        summary = re.search(r"^summary: (\d+)", text, re.M)
        if reason and summary:
            found[reason.group(1)] = int(summary.group(1))
    return found


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3, help="calls counted per mode (default 3)")
    parser.add_argument(
        "--heap",
        type=int,
        default=0,
        help="also count the first model's trace in a frozen heap grown by this many objects",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        child(options.calls, options.heap)
        return 0
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        print(f"capture_instructions.py needs {' and '.join(missing)} (Debian: apt-get install valgrind).")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={tmp}/callgrind.out",
            sys.executable,
            __file__,
            "--child",
            f"--calls={options.calls}",
            f"--heap={options.heap}",
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout + done.stderr[-3000:])
            return done.returncode
        found = counts(Path(tmp))
    print(f"instructions per call, {options.calls} calls of each counted, automatic collection off")
    for line in done.stdout.splitlines():
        match = re.match(r"model (\d+) ops (\d+) name (.*)", line)
        if not match:
            continue
        index, ops, name = match.group(1), int(match.group(2)), match.group(3)
        per_call = {mode: found[f"m{index}-{mode}"] / options.calls for mode in MODES}
        plain = per_call["plain"]
        added = {mode: (per_call[mode] - plain) / ops for mode in ("all", "none")}
        print(
            f"{name:24s} {ops} ops; plain {plain / 1e6:.1f} M; trace {per_call['all'] / 1e6:.1f} M "
            f"({per_call['all'] / plain:.2f}x), {added['all'] / 1e3:.1f} k per op; "
            f"layers_to_save=None {per_call['none'] / 1e6:.1f} M ({per_call['none'] / plain:.2f}x), "
            f"{added['none'] / 1e3:.1f} k per op; fixed {per_call['fixed'] / 1e6:.1f} M"
        )
    if options.heap:
        small, big = found["m0-all"] / options.calls, found["heap"] / options.calls
        print(
            f"the first model's trace after gc.freeze() and {options.heap:,} more objects: {big / 1e6:.1f} M "
            f"against {small / 1e6:.1f} M in the small process ({big / small:.4f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
