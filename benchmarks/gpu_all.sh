#!/usr/bin/env bash
# Everything that needs a GPU, in one go: the `cuda` tests, then the GPU benchmarks, each
# writing its log (and the benchmarks their JSON) into OUTDIR.
#
#   bash benchmarks/gpu_all.sh OUTDIR [--quick]
set -uo pipefail
out=${1:?usage: gpu_all.sh OUTDIR [--quick]}
shift
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' >>"$out/gpu.txt"
python3 -m pytest -q -m cuda -p no:cacheprovider tests 2>&1 | tail -40 >"$out/cuda_tests.txt"
python3 benchmarks/gpu.py --json "$out/gpu.json" "$@" >"$out/gpu_bench.txt" 2>&1
if [ -f benchmarks/watch_gpu.py ]; then
    python3 benchmarks/watch_gpu.py --json "$out/watch_gpu.json" "$@" >"$out/watch_gpu.txt" 2>&1
fi
cat "$out"/*.txt
