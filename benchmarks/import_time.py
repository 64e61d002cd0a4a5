"""Time of ``import torchlens`` after ``import torch``, in fresh processes (median of N).

The target is under 0.1 s: tracing needs only the trace wing; drawing, rerunning and the
training explorer load on first use.

    python benchmarks/import_time.py [--runs 9]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

PROBE = "import time, torch; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"


def timed(module: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(module=module)], check=True, capture_output=True, text=True
        )
        times.append(float(out.stdout.strip()))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    runs = parser.parse_args().runs
    face = timed("torchlens", runs)
    everything = timed("torchlens, torchlens.trace.render, torchlens.train, torchlens.trace.rerun", runs)
    print(f"import torchlens after torch: {face * 1000:.0f} ms (median of {runs})")
    print(f"... with drawing, rerun and the explorer loaded too: {everything * 1000:.0f} ms")


if __name__ == "__main__":
    main()
