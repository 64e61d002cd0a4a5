#!/usr/bin/env python
"""Run the model zoo (``tests/zoo_models.py``) and print one row per model.

For each selected model, in one process, sequentially, on the CPU:

* ``ops``      -- ``len(tl.log_forward_pass(model, args, kwargs, layers_to_save=None,
                  random_seed=0))``; shown as ``a!=b`` when two such passes disagree;
* ``validate`` -- ``tl.validate_model_activations(model, args, kwargs, random_seed=0)``
                  (``ERROR`` when torchlens raised; the exception follows the table);
* ``seconds``  -- wall time of the whole row (build + validate + two counts), i.e. what the
                  zoo test of that model costs;
* ``status``   -- ``ok``; ``xfail`` (fails, a known torchlens bug: strict xfail in
                  tests/test_zoo.py); ``FAIL`` (fails, not known: a new bug); ``XPASS`` (a known
                  bug no longer shows: remove the entry from ``XFAIL`` in tests/zoo_models.py).

How to run
----------
    .venv/bin/python benchmarks/zoo_table.py                  # every model
    .venv/bin/python benchmarks/zoo_table.py --quick          # only the models not marked slow
    .venv/bin/python benchmarks/zoo_table.py --family timm,recurrent
    .venv/bin/python benchmarks/zoo_table.py --models resnet,gpt2   # substrings of names
    .venv/bin/python benchmarks/zoo_table.py --list           # names, families, notes; run nothing
    .venv/bin/python benchmarks/zoo_table.py --verbose        # validate(verbose=True)

torch runs with one intra-op thread, as tests/test_zoo.py does (``--threads N`` to change it,
``--threads 0`` for torch's default).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
from zoo_models import FAMILIES, FAST_SECONDS, ZOO, ZooModel  # noqa: E402

import torchlens as tl  # noqa: E402


def select(families: Optional[str], models: Optional[str], quick: bool) -> List[ZooModel]:
    chosen = list(ZOO)
    if families:
        wanted = [f.strip() for f in families.split(",") if f.strip()]
        unknown = [f for f in wanted if f not in FAMILIES]
        if unknown:
            raise SystemExit(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
        chosen = [e for e in chosen if e.family in wanted]
    if models:
        parts = [m.strip() for m in models.split(",") if m.strip()]
        exact = {e.name for e in chosen if e.name in parts}
        chosen = [e for e in chosen if e.name in exact or any(p not in exact and p in e.name for p in parts)]
    if quick:
        chosen = [e for e in chosen if not e.slow]
    return chosen


def run_one(entry: ZooModel, verbose: bool):
    """(ops text, validate text, seconds, error text or None)."""
    start = time.perf_counter()
    error = None
    ops_text, valid_text = "-", "-"
    try:
        model, args, kwargs = entry.build()
        valid = tl.validate_model_activations(model, list(args), kwargs or None, random_seed=0, verbose=verbose)
        valid_text = str(valid)
        counts = [
            len(tl.log_forward_pass(model, list(args), kwargs or None, layers_to_save=None, random_seed=0))
            for _ in range(2)
        ]
        ops_text = str(counts[0]) if counts[0] == counts[1] else f"{counts[0]}!={counts[1]}"
    except Exception:  # noqa: BLE001 - reported in the table
        error = traceback.format_exc()
        valid_text = "ERROR"
    seconds = time.perf_counter() - start
    return ops_text, valid_text, seconds, error


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", help=f"comma-separated families ({', '.join(FAMILIES)})")
    parser.add_argument("--models", help="comma-separated model names or name substrings")
    parser.add_argument(
        "--quick", action="store_true", help=f"only the models not marked slow (zoo test under {FAST_SECONDS:g}s)"
    )
    parser.add_argument("--list", action="store_true", help="list the selected models and exit")
    parser.add_argument("--verbose", action="store_true", help="validate with verbose=True")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1, as in tests/test_zoo.py; 0: torch's default)",
    )
    options = parser.parse_args(argv)

    if options.threads > 0:
        torch.set_num_threads(options.threads)
    chosen = select(options.family, options.models, options.quick)
    if not chosen:
        print("no model selected")
        return 1
    if options.list:
        for e in chosen:
            mark = "slow" if e.slow else ""
            print(f"{e.name:<42} {e.family:<15} {mark:<5} {e.note}")
        return 0

    width = max(len(e.name) for e in chosen)
    header = f"{'model':<{width}}  {'family':<14} {'ops':>7}  {'validate':<8} {'seconds':>8}  status"
    print(header)
    print("-" * len(header), flush=True)
    errors = []
    total = 0.0
    statuses: Dict[str, int] = {}
    for entry in chosen:
        ops, valid, seconds, error = run_one(entry, options.verbose)
        total += seconds
        failed = valid != "True" or "!=" in ops
        if error or "!=" in ops:
            status = "FAIL"  # a crash or an unstable count is never an expected failure
        elif entry.xfail:
            status = "xfail" if failed else "XPASS"
        else:
            status = "FAIL" if failed else "ok"
        statuses[status] = statuses.get(status, 0) + 1
        print(f"{entry.name:<{width}}  {entry.family:<14} {ops:>7}  {valid:<8} {seconds:>8.2f}  {status}", flush=True)
        if error:
            errors.append((entry.name, error))
        gc.collect()
    print("-" * len(header))
    counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    print(f"{len(chosen)} models: {counts}; {total:.1f}s in all", flush=True)
    for name, error in errors:
        print(f"\n=== {name} ===\n{error}")
    return 1 if statuses.get("FAIL") or statuses.get("XPASS") else 0


if __name__ == "__main__":
    sys.exit(main())
