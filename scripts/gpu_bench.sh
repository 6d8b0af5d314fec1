#!/usr/bin/env bash
# On a CUDA machine, within 8 minutes:
# - sparse vs dense decode attention at 32K/100K tokens and shm host pool <-> GPU page transfer vs
#   memcpy (benchmarks/gpu_kernels.py -> gpu_kernels.json);
# - end-to-end decode of our engine vs transformers on the GPU, SmolLM2 135M and 1.7B shapes with
#   random weights, and GPU-vs-CPU greedy agreement (benchmarks/gpu_decode.py -> gpu_decode.json;
#   needs the tokenizer exported by scripts/device_prep.sh into .device/, carried along).
# Writes into ${OUT:-results/gpu}. Exits non-zero if either part fails.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
out="${OUT:-results/gpu}"
mkdir -p "$out"
rc=0
timeout 240 python3 -m benchmarks.gpu_kernels --out "$out" "$@" || rc=1
timeout 200 python3 -m benchmarks.gpu_decode --device cuda --tokenizer-dir .device/tokenizer --out "$out" || rc=1
exit $rc
