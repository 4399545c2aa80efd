#!/usr/bin/env bash
# On the H200 (after .gpu-stage/install.sh): GPU tests and benchmarks, results under $OUT.
#   bash scripts/gpu_run.sh [tests] [resample] [proxy] [loader] [train] [pace] [trainprofile] [traindiag]
#                           [convert] [convtrace]
#                           [decode] [cache]
#   (default: tests resample proxy loader convert)
set -uo pipefail
export PYTHONPATH=/tmp/site:/tmp/sitk:$PWD MEDPROC_OFFLINE=1 PYTHONUNBUFFERED=1 PATH=/tmp/sitk/bin:$PATH
# compressed files of pydicom-data, copied to .gpu-data (the package is not installed there)
[ -d .gpu-data/pydicom-data ] && export MEDPROC_PYDICOM_DATA=$PWD/.gpu-data/pydicom-data
ls .gpu-data/wheels/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/sitk .gpu-data/wheels/*.whl
# medproc's own compiled dependencies the machine lacks (isal, pylibjpeg and its plugins), as
# cp312 wheels: python -m pip download --only-binary :all: --no-deps --python-version 3.12
#   -d .gpu-data/extra isal pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg pylibjpeg-rle
ls .gpu-data/extra/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-data/extra/*.whl
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
want() { [ $# -eq 0 ] || [[ " $ALL " == *" $1 "* ]]; }
ALL="$*"
[ -z "$ALL" ] && ALL="tests resample proxy loader convert"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
if want tests; then
  # the pre-encoded series the GPU decoding tests collect (tests/test_gpu_load.py), made here
  # when they were not carried and the encoders (imagecodecs, staged as a wheel) are there
  if [ ! -d .gpu-data/decode96 ] && python -c "import imagecodecs" 2>/dev/null; then
    python scripts/make_decode_data.py .gpu-data/decode96 --size 96 --slices 3 > /dev/null
  fi
  python -m pytest -m gpu -q -p no:cacheprovider tests/ --ignore=tests/test_notebooks.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
fi
if want resample; then
  python bench/resample.py --device gpu --n 8 --slices 300 --batch 4 --out "$OUT/resample_h200.json" > "$OUT/bench_resample.log" 2>&1
  tail -12 "$OUT/bench_resample.log"
fi
if want proxy; then
  timeout 400 python bench/proxy.py --workers 8 16 --samples 96 --batch 4 --out "$OUT/proxy_h200.json" > "$OUT/bench_proxy.log" 2>&1
  grep -E "^(crop|whole) " "$OUT/bench_proxy.log"; tail -3 "$OUT/bench_proxy.log"
fi
if want loader; then
  timeout 420 python bench/loader.py --cases 24 --workers 12 --batches 60 --out "$OUT/loader_h200.json" > "$OUT/bench_loader.log" 2>&1
  grep -E "^(medproc|monai|data)" "$OUT/bench_loader.log"; tail -3 "$OUT/bench_loader.log"
fi
if want train; then
  # the real loop: each method in a process of its own (GPU memory peaks not shared)
  # (TRAIN_REPEATS=3: each method three times, interleaved, medians; ~8 minutes)
  timeout 590 python bench/train.py --isolate --cache auto host --repeats "${TRAIN_REPEATS:-1}" \
    --out "$OUT/train_h200.json" > "$OUT/bench_train.log" 2>&1
  python3 -c "
import json
r = json.load(open('$OUT/train_h200.json'))
for k, v in r['methods'].items():
    keys = ('steps_per_s', 'pct_of_limit', 'data_wait_fraction', 'peak_gpu_GiB', 'gpu_memory_vs_tuned')
    print(k, {x: round(v[x], 3) for x in keys if x in v})
" || tail -20 "$OUT/bench_train.log"
fi
if want pace; then
  # pacing A/B (medproc.pipeline.pace): MEDPROC_PACE=0 (off) against the default, interleaved,
  # each cache, PACE_REPEATS times; the limit once
  for r in $(seq "${PACE_REPEATS:-2}"); do
    for p in 0 "${PACE_TRY:-0.35}"; do
      skip="tuned limit"; [ "$r" = 1 ] && [ "$p" = 0 ] && skip="tuned"  # the limit once
      MEDPROC_PACE=$p timeout 300 python bench/train.py --isolate --skip $skip --cache auto host \
        --out "$OUT/pace_${p}_$r.json" > "$OUT/pace_${p}_$r.log" 2>&1
      python3 -c "
import json
r = json.load(open('$OUT/pace_${p}_$r.json'))
for k, v in r['methods'].items():
    keys = ('steps_per_s', 'data_wait_fraction', 'peak_gpu_GiB', 'pace_wait_ms_per_batch')
    print('pace=$p run $r', k, {x: round(v[x], 3) for x in keys if x in v})
" || tail -5 "$OUT/pace_${p}_$r.log"
    done
  done
fi
if want trainprofile; then
  # where the engine thread's and the loop's time goes (per-call wall and CPU time)
  for c in auto host; do
    timeout 300 python bench/train_profile.py --skip limit tuned --steps 150 --cache $c \
      --out "$OUT/train_profile_$c.json" > "$OUT/train_profile_$c.log" 2>&1
    echo "cache=$c"; grep -E "^medproc |wall" "$OUT/train_profile_$c.log" | cut -c1-300
  done
fi
if want traindiag; then
  # where the loader's GPU memory goes in the training process: medproc (cache=host) alone,
  # with PyTorch's and DALI's allocator settings varied
  for envs in "X=0" "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" "DALI_USE_VMM=0" \
              "DALI_USE_DEVICE_MEM_POOL=0"; do
    env $envs timeout 200 python bench/train.py --isolate --cache host --skip limit tuned \
      --out "$OUT/traindiag.json" > "$OUT/traindiag.log" 2>&1
    echo "$envs"; grep -E "^medproc" "$OUT/traindiag.log" | cut -c1-700
  done
fi
conv_data() {
  # byte-code, as a pip install leaves it (the staged packages were installed --no-compile):
  # the staged packages, numpy and medproc; then the series
  [ -d /tmp/conv_all ] && return
  python -m compileall -q -j 16 /tmp/site /tmp/sitk "$(python -c "import numpy, os; print(os.path.dirname(numpy.__file__))")" medproc > /dev/null 2>&1
  python - <<'PY'
import os
from concurrent.futures import ProcessPoolExecutor
from medproc.sample_data import make_dataset
def one(i):
    make_dataset(f"/tmp/conv/p{i:02d}", cases=1, size=512, slices=(150, 250), seed=200 + i)
    os.makedirs("/tmp/conv_all", exist_ok=True)
    os.rename(f"/tmp/conv/p{i:02d}/dicom/case000", f"/tmp/conv_all/case{i:02d}")
with ProcessPoolExecutor(16) as ex:
    list(ex.map(one, range(int(os.environ.get("CONVERT_CASES", "48")))))
PY
}
if want convtrace; then
  # where a whole convert process's time goes (medproc._trace), each route traced in turn;
  # CONVTRACE: the runs, "<name>:<env>:<options>" (env "-" for none; several: A=1,B=2, and
  # options likewise: --device=gpu,--workers=16; so no
  # value may hold ":" or ",")
  conv_data
  mkdir -p "$OUT/traces"
  for run in ${CONVTRACE:-cpu:-:--device=cpu gpu:-:--device=gpu gpu_all:MEDPROC_GPU_SHARE=0:--device=gpu cpu2:-:--device=cpu gpu2:-:--device=gpu}; do
    IFS=: read -r name envs opts <<< "$run"
    rm -rf /tmp/conv_out; [ "$envs" = - ] && envs="X=0"
    s=$(date +%s.%N)
    env ${envs//,/ } MEDPROC_TRACE="$OUT/traces/$name" python -m medproc -v convert /tmp/conv_all \
      -o /tmp/conv_out --spacing 1.5 ${opts//,/ } > "$OUT/traces/$name.log" 2>&1
    echo "== $name ($envs $opts): rc $? $(python3 -c "print(round($(date +%s.%N) - $s, 3))") s"
    grep -E "GPU service|case\(s\) to convert|converted," "$OUT/traces/$name.log" | cut -c1-220
    python -m medproc trace "$OUT/traces/$name" --png "$OUT/traces/$name.png" | sed -n '/seconds per/,$p'
  done
  tar czf "$OUT/traces.tgz" -C "$OUT" traces && rm -rf "$OUT/traces"  # (one file comes back)
fi
if want convert; then
  conv_data
  python -X importtime -c "import torch" 2>&1 | tail -1
  # whole processes (as a user runs them: start-up included) + the per-stage breakdown
  # CONVERT_EXT=nii: both tools write uncompressed NIfTI (the same work; see bench/convert.py)
  ext=${CONVERT_EXT:-nii.gz}; sfx=${CONVERT_EXT:+_$CONVERT_EXT}
  timeout 500 python bench/convert.py /tmp/conv_all --workers 16 --device cpu gpu --skip inprocess \
    --whole-process --no-sitk-serial --counts "${CONVERT_CASES:-48}" --jobs auto --repeats "${CONVERT_REPEATS:-3}" --stages \
    --ext "$ext" --out "$OUT/convert_h200$sfx.json" > "$OUT/bench_convert$sfx.log" 2>&1
  grep -E "median|SimpleITK at its best|^  |per-stage" "$OUT/bench_convert$sfx.log"
fi
if want convab; then
  # whole `medproc convert` processes alternated, CONVAB_ROUNDS rounds: by default the CPU
  # route and the GPU route; CONVAB_RUNS: "<device>:<env>" items (env X=0 for none)
  conv_data
  for r in $(seq "${CONVAB_ROUNDS:-3}"); do
    for run in ${CONVAB_RUNS:-cpu:X=0 gpu:X=0}; do
      IFS=: read -r dev envs <<< "$run"
      rm -rf /tmp/conv_out
      s=$(date +%s.%N)
      env $envs python -m medproc -v convert /tmp/conv_all -o /tmp/conv_out --spacing 1.5 \
        --device "$dev" > "$OUT/convab_${dev}_${envs//=/-}_$r.log" 2>&1
      rc=$?; e=$(date +%s.%N)
      echo "round $r $dev $envs: rc $rc $(python3 -c "print(round($e - $s, 3))") s," \
        "$(du -sb --exclude='*.json' --exclude='*.csv' /tmp/conv_out | cut -f1) bytes"
      grep -o "GPU service: .*" "$OUT/convab_${dev}_${envs//=/-}_$r.log" | cut -c1-240
    done
  done
fi
if want decode; then
  # prove the GPU decode support table on this machine, test it, then benchmark
  # synthetic series at two sizes (512^2 and the tests' 96^2) plus pydicom's and pydicom-data's files
  PROBE_JOBS=12 python scripts/probe_gpu_decode.py .gpu-data/decode .gpu-data/decode96 > "$OUT/probe_decode.log" 2>&1
  grep -v -i -E "nvtiff|^Note:" "$OUT/probe_decode.log" | tail -2
  cp medproc/pipeline/gpu_decode_support.json "$OUT/"
  python -m pytest -m gpu -q -p no:cacheprovider tests/test_decode.py 2>&1 | tee "$OUT/gpu_decode_tests.log" | tail -4
  if [ "${DECODE_BENCH:-1}" != 0 ]; then
    python scripts/make_decode_data.py /tmp/dec --slices 100 --series 4 \
      --only ${DECODE_ONLY:-j2k j2k-signed jpegll jpegll-signed htj2k} > /dev/null 2>&1
    timeout 400 python bench/decode.py /tmp/dec --workers 16 --load --out "$OUT/decode_h200.json" > "$OUT/bench_decode.log" 2>&1
    grep -E "^[a-z0-9-]+ \{" "$OUT/bench_decode.log" | cut -c1-600
  fi
fi
if want cache; then
  timeout 300 python bench/cache.py --cases 6 --samples 256 --batch 4 --real .data/pyradiomics/lung1_image.nrrd \
    --out "$OUT/cache_h200.json" > "$OUT/bench_cache.log" 2>&1
  tail -4 "$OUT/bench_cache.log"
fi
