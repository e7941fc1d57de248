#!/usr/bin/env bash
# The accelerator-machine check (one run, about 7 minutes on a 16-core H200 host): build the
# extension for that machine's Python, run the loader and pinning tests on the GPU backend, the
# sharding benchmark when present, then the GPU transfer benchmark at 37 and 192 MB batches and the
# loader benchmark at 15 processes (hydrax 0.2.2 alongside when its wheel is in .whl/). Results go
# to $OUT; QUICK=1 skips the extra 15-loader transfer run. Run it as tools/bench/device_check.sh
# from anywhere: it works from the repository root.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/hydrax-device}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
{ python3 --version; nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; } 2>&1 | tee "$OUT/machine.txt"
python3 setup.py -q build_ext --inplace > "$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
timeout 150 python3 -m pytest ${TESTS:-tests/test_loader.py tests/test_compat.py tests/test_faults.py tests/test_pinning.py} -q -p no:cacheprovider -rs \
  2>&1 | tail -15 | tee "$OUT/tests.txt"
[ -f tools/bench/bench_sharding.py ] && { timeout 120 python3 tools/bench/bench_sharding.py --quick 2>&1 | tee "$OUT/sharding.txt" || true; }
timeout 120 python3 tools/bench/bench_gpu.py --sizes 37,192 --workers 8 --depth 6 --seconds 3 2>&1 | tee "$OUT/gpu.txt"
[ -n "${QUICK:-}" ] || timeout 60 python3 tools/bench/bench_gpu.py --sizes 192 --workers 15 --depth 8 --seconds 3 2>&1 \
  | grep -E 'hydrax|unavailable' | tee -a "$OUT/gpu.txt"
extra=()
if ls .whl/hydrax-0.2.2-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site022 .whl/hydrax-0.2.2-*.whl
  printf '#!/bin/sh\nPYTHONPATH=/tmp/site022 exec python3 "$@"\n' > /tmp/py022 && chmod +x /tmp/py022
  extra=(--hydrax022 /tmp/py022)
fi
timeout 200 python3 tools/bench/bench_loader.py --processes 15 --repeat 1 --seconds 2 "${extra[@]}" 2>&1 | tee "$OUT/loader15.txt"
