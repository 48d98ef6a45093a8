#!/usr/bin/env bash
# Device call after d3_setup_tests.sh on the same warm machine (carry .gpu/scripts): issue 32's command three times,
# no profiler: bench/e2e.py --device cuda --loads 64 256 --stagger, the engine in its worker process on both sides
# (in process: in a process of its own since this tree, so the server finds the GPU free).
set -u
R=/tmp/trtllm-gpu/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
grep -c "def wait_warm" /tmp/trtllm-gpu/src/trtllm_model/embedded/engine.py
rm -f $R/e2e-*.json
SKIP_SETUP=1 STEPS="probe e2e e2e e2e" ENGINE_MODES=process \
  E2E_ARGS="--device cuda --loads 64 256 --stagger --warmup 3 --window 8 --client-procs 4" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/e2e-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
