#!/usr/bin/env bash
# Everything that needs a GPU, in one call on the device machine (see docs/benchmarks.md):
#   the GPU-marked tests, `kb-gym demo`, `kb-gym bench` on the official problems and `kb-gym soak`.
#   Usage: scripts/gpu_check.sh [all|tests|bench|demo|soak]  (tests = tests + demo; bench = bench + soak)
# Expects, carried beside the working tree: .whl/ (gymnasium, trl, datasets wheels from
# ../shared/tools/device-wheels) and .device/kernelbench/ (the official level_N.jsonl files).
# `python3 -P`: the repository root holds a kb_gym/ folder that would shadow the installed package.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/kb_gym_out}; mkdir -p "$OUT"
SITE=/tmp/kb_site
rm -rf "$SITE"  # a warm machine keeps the last install; pip --target would not replace it
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" . || exit 1
export PYTHONPATH=$SITE KB_GYM_DATASET=$PWD/.device/kernelbench KB_GYM_CACHE=/tmp/kb_gym_cache
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
what=${1:-all}
rc=0
if [ "$what" = all ] || [ "$what" = tests ]; then
  python3 -P -m pytest -q -p no:cacheprovider --durations=12 -m gpu tests ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  python3 -P -m kb_gym.cli bench --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
fi
if [ "$what" = all ] || [ "$what" = tests ] || [ "$what" = demo ]; then
  python3 -P -m kb_gym.cli demo 2>&1 | tee "$OUT/demo.log"
fi
if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = soak ]; then
  python3 -P -m kb_gym.cli soak -n "${SOAK_N:-1000}" --max-minutes "${SOAK_MINUTES:-4}" --out "$OUT/soak.json" 2>&1 \
    | tee "$OUT/soak.log"
fi
echo "== summary =="
grep -E "passed|failed" "$OUT/gpu_tests.log" 2>/dev/null | tail -1
tail -n 12 "$OUT/bench.log" 2>/dev/null
tail -n 9 "$OUT/soak.log" 2>/dev/null
exit $rc
