#!/usr/bin/env bash
# bench/e2e.py through Triton at 256 streams (no profiler, no timers), measure_all.sh's e2e-ab over three trees in
# turn: TREES="base other this" (base b5406cf: transformers' encode; other 27ba7b5: the Rust encode; this dd9c5e3: the
# Rust encode and execute()'s batch sent to the worker as one message). SETUP=1 first installs (call 3 of a fresh
# machine, after staging .gpu/bundle .gpu/numpy, then .gpu/model0; carry .gpu/model1 .gpu/scripts).
set -u
G=/tmp/trtllm-gpu; R=$G/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${SETUP:-0}" = 1 ]; then
  echo "=== $(date -u +%H:%M:%S) setup"
  bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -1
fi
rm -f $R/e2e-*.json
mkdir -p $OUT; ( while true; do cp $R/e2e-*.json $OUT/ 2>/dev/null; sleep 5; done ) &  # a call cut short keeps its runs
SKIP_SETUP=1 STEPS=e2e-ab AB_TREES="$TREES" AB_PAIRS=1 bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F" \
  | grep --line-buffered -A1 "=== \|via Triton  load\|results:"
mkdir -p $OUT && cp $R/e2e-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
