#!/usr/bin/env python
"""Writing a logged step into the run database: what a durable step waits for at its end.

A run of ``--series`` series (432: a logged ResNet-18 step) written step after step by
``RunWriter.write_step``, with the log checkpointed between steps as the watch does during a
backward pass. Printed every ``--every`` steps: the median time of a step's write (its commit
included) and the longest (a run passing ``max_columns`` = 512 columns merges each pair of
neighbouring columns, at logged steps 512, 1024, ...: that write waits for it; after the first,
each step is merged into the column of the step before), the pages a commit adds to the
log, and the checkpoint's mean cost a step (``RunWriter.checkpoint``, called once a step as the
watch does, copies the log back every ``CHECKPOINT_PAGES`` pages); beside it the same
run written into a ``columns`` table kept in key order (``WITHOUT ROWID``, the layout before
2026-12-06), in the same process, taking turns. No torch work: this is the host's share.

    .venv/bin/python benchmarks/run_write_speed.py [--series 432] [--steps 1100] [--every 100]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Dict, List

import numpy as np

from torchlens.train.store import database
from torchlens.web.exact import EXACT_FIELDS

KEY_ORDER = database._SCHEMA.replace("PRIMARY KEY (series_id, slot));", "PRIMARY KEY (series_id, slot)) WITHOUT ROWID;")


def writer(folder: str, schema: str) -> database.RunWriter:
    current = database._SCHEMA
    database._SCHEMA = schema
    try:
        return database.RunWriter(folder, "M", {}, bins=64)
    finally:
        database._SCHEMA = current


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=432)
    parser.add_argument("--steps", type=int, default=1100)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args()
    assert KEY_ORDER != database._SCHEMA, "the key-order layout could not be made from the schema"
    n, rng = args.series, np.random.default_rng(0)
    keys = [(f"m{i // 4}:1", ("io", "io_grad", "params", "params_grad")[i % 4], f"t{i}") for i in range(n)]
    counts = rng.random((n, 64)).astype(np.float32)
    lo, exact = rng.random(n), rng.random((n, len(EXACT_FIELDS)))
    root = tempfile.mkdtemp(prefix="torchlens-write-")
    runs = {"rows side by side": writer(f"{root}/a", database._SCHEMA), "key order": writer(f"{root}/b", KEY_ORDER)}
    found: Dict[str, Dict[str, List[float]]] = {k: {"write": [], "pages": [], "checkpoint": []} for k in runs}
    print(f"{n} series; medians over the last {args.every} steps")
    head = ": write ms, longest ms, log pages, checkpoint ms"
    print(f"{'steps':>6}  " + "  ".join(f"{k + head:>66}" for k in runs))
    for step in range(args.steps):
        for name, run in runs.items():
            start = time.perf_counter()
            run.write_step(step, keys, counts, lo, hi=lo + 1, nonfinite=np.zeros(n), exact=exact)
            found[name]["write"].append(time.perf_counter() - start)
            start = time.perf_counter()
            run.checkpoint()  # as the watch calls it once a step: it copies the log every few steps
            found[name]["checkpoint"].append(time.perf_counter() - start)
            found[name]["pages"].append(run.log_pages_per_commit)
        if (step + 1) % args.every == 0:
            cells = []
            for name in runs:
                f = {k: statistics.median(v[-args.every :]) for k, v in found[name].items()}
                f["checkpoint"] = statistics.mean(found[name]["checkpoint"][-args.every :])
                longest = max(found[name]["write"][-args.every :])
                cells.append(
                    f"{f['write'] * 1e3:>22.2f} {longest * 1e3:>13.0f} {f['pages']:>14.0f} {f['checkpoint'] * 1e3:>14.2f}"
                )
            print(f"{step + 1:>6}  " + "  ".join(cells))
    for run in runs.values():
        run.close()


if __name__ == "__main__":
    main()
