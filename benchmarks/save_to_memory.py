"""Passes bigger than memory: ``log_forward_pass(save_to=folder)`` under a hard memory limit.

A parameter-free chain of elementwise operations on a large tensor saves far more activation
bytes than the memory the process is allowed. Each measurement runs in its own subprocess
that, after importing torch and building its input, caps its private memory with
``resource.setrlimit(RLIMIT_DATA)`` at what it uses then plus ``--budget-mb``:

- ``plain``: a plain forward pass (the reference peak);
- ``save_to``: ``log_forward_pass(..., save_to=folder)``, every layer saved;
- ``in_memory``: the same trace kept in memory, which cannot fit and must fail.

Printed: peak RSS of each (``ru_maxrss``), the saved bytes against the cap, and the write
throughput of ``save_to`` (saved bytes / pass seconds; the pass includes computing).

    python benchmarks/save_to_memory.py                      # 64 ops of 32 MB under a 600 MB cap
    python benchmarks/save_to_memory.py --ops 32 --budget-mb 400
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _vm_data_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def child(mode: str, ops: int, mb: int, budget_mb: int, folder: str) -> None:
    import resource

    import torch

    import torchlens as tl

    torch.set_num_threads(1)

    class Chain(torch.nn.Module):
        def forward(self, x):
            for _ in range(ops):
                x = torch.sin(x) * 1.0001
            return x

    model, x = Chain(), torch.rand(mb * (1 << 20) // 4 // 1024, 1024)
    tl.log_forward_pass(model, torch.rand(4, 4))  # warm up imports and wrappers before the cap
    cap = _vm_data_bytes() + budget_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    start = time.perf_counter()
    result = {"mode": mode}
    try:
        with torch.no_grad() if mode == "plain" else torch.enable_grad():
            if mode == "plain":
                model(x)
            elif mode == "save_to":
                history = tl.log_forward_pass(model, x, save_to=folder)
                result["saved_bytes"] = history.saved_tensor_bytes
                result["layers"] = len(history)
            else:
                history = tl.log_forward_pass(model, x)
                result["saved_bytes"] = history.saved_tensor_bytes
        result["ok"] = True
    except (MemoryError, RuntimeError) as error:  # torch's allocator raises RuntimeError
        result["ok"] = False
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
    result["seconds"] = time.perf_counter() - start
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def run(mode: str, args: argparse.Namespace, folder: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--ops",
            str(args.ops),
            "--mb",
            str(args.mb),
            "--budget-mb",
            str(args.budget_mb),
            "--folder",
            folder,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{mode} run printed no result (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=64, help="operations in the chain")
    parser.add_argument("--mb", type=int, default=32, help="MB per activation")
    parser.add_argument("--budget-mb", type=int, default=600, help="memory the traced pass may add (RLIMIT_DATA)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.ops, args.mb, args.budget_mb, args.folder)
        return
    with tempfile.TemporaryDirectory() as tmp:
        plain = run("plain", args, os.path.join(tmp, "p"))
        streamed = run("save_to", args, os.path.join(tmp, "s"))
        in_memory = run("in_memory", args, os.path.join(tmp, "m"))
    saved_mb = args.mb * (args.ops * 2 + 1)  # sin and mul per step, and the input
    print(
        f"chain of {args.ops * 2} operations on {args.mb} MB tensors: about {saved_mb} MB of activations, "
        f"memory cap {args.budget_mb} MB above the start ({saved_mb / args.budget_mb:.1f}x the cap)"
    )
    print(f"{'run':<11} {'ok':<4} {'seconds':>8} {'peak RSS MB':>12}  note")
    for r in (plain, streamed, in_memory):
        note = r.get("error", "")
        if r["mode"] == "save_to" and r["ok"]:
            note = (
                f"{r['saved_bytes'] / 2**20:.0f} MB written, {r['saved_bytes'] / 2**20 / r['seconds']:.0f} MB/s "
                f"(pass included)"
            )
        print(f"{r['mode']:<11} {str(r['ok']):<4} {r['seconds']:>8.2f} {r['peak_rss_mb']:>12.0f}  {note}")
    if streamed["ok"]:
        print(f"save_to peak RSS / plain forward peak RSS: {streamed['peak_rss_mb'] / plain['peak_rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
