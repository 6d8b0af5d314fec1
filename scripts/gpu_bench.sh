#!/usr/bin/env bash
# On a CUDA machine: sparse vs dense decode attention at 32K/100K tokens and shm host pool <-> GPU
# page transfer vs memcpy (benchmarks/gpu_kernels.py). Writes ${OUT:-results/gpu}/gpu_kernels.json.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
out="${OUT:-results/gpu}"
mkdir -p "$out"
exec timeout 240 python3 -m benchmarks.gpu_kernels --out "$out" "$@"
