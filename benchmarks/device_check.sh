#!/usr/bin/env bash
# The prepared GPU check: correctness of ATMM, PTS, backbones and predict on the GPU
# against the CPU reference, then one images/s table. Runs on the GPU machine DESIGN.md
# describes: its own torch, no Ray, no network, from the repository root, in under 8 minutes.
#   bash benchmarks/device_check.sh                       # GPU (cuda)
#   bash benchmarks/device_check.sh --device cpu --quick  # the CPU half, anywhere
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.
PY=${PYTHON:-python3}
OUT=${OUT:-.}
mkdir -p "$OUT"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
timeout "${TIMEOUT:-470}" "$PY" benchmarks/device_check.py --json "$OUT/device_check.json" "$@" 2>&1 | tee "$OUT/device_check.log"
