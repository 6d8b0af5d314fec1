#!/usr/bin/env bash
# Check every Triton kernel against its torch reference on a CUDA machine (production shapes),
# with timings. Writes ${OUT:-results/gpu}/gpu_check.json; exits non-zero on a mismatch.
# Usage: scripts/gpu_check.sh [--dry-run]   (--dry-run: tiny CPU config, Triton interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
out="${OUT:-results/gpu}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
exec timeout 290 python3 -m kernels.gpu_check --out "$out" "$@"
