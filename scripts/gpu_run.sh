#!/usr/bin/env bash
# On the H200 (after .gpu-stage/install.sh): GPU tests and benchmarks, results under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:/tmp/sitk:$PWD MEDPROC_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python -m pytest -m gpu -q -p no:cacheprovider tests/ "$@" 2>&1 | tee "$OUT/gpu_tests.log"
python bench/resample.py --device gpu --n 8 --slices 300 --batch 4 --out "$OUT/resample_gpu.json" 2>&1 | tee "$OUT/bench_resample.log"
