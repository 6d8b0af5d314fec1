#!/usr/bin/env bash
# The whole device session in one command (the `device` tool's machine: python3 with torch and
# triton, packages the project adds carried as wheels in .whl/): kernel checks, GPU benchmarks and
# the CUDA-marked tests. Run scripts/device_prep.sh here first and carry .device (and .whl).
# Everything it writes lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
fi
export PYTHONUNBUFFERED=1 OUT="${OUT:-results/gpu}"
mkdir -p "$OUT"
nvidia-smi -L; df -h /dev/shm | tail -1
rc=0
scripts/gpu_check.sh 2>&1 | tee "$OUT/gpu_check.log" || rc=1
scripts/gpu_bench.sh 2>&1 | tee "$OUT/gpu_bench.log" || rc=1
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kvtier 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15 || rc=1
exit $rc
