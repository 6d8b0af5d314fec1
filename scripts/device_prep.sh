#!/usr/bin/env bash
# Run here (where the default model is) before a device session: writes what the GPU machine
# cannot get itself into .device/ (git-ignored; name it in the device run's `carry`):
# the default model's tokenizer for benchmarks/gpu_decode.py. The GGUF itself is too large to travel in one call: scripts/device_train_drafter.py says how it travels in two.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
python -m benchmarks.gpu_decode --export-tokenizer .device/tokenizer
du -sh .device
