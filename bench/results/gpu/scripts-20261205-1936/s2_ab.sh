#!/usr/bin/env bash
# Device call (after `run_on_gpu.sh stage .gpu/engine .gpu/model1`; carry .gpu/model0 .gpu/scripts): setup-engine,
# then the revert of the worker's burst admission A/B: base d000384 (bursts taken together), this 3f3017a (one command
# at a time), engine in its worker process, 256 streams, 5 rounds a measurement, median of 3, two pairs as time allows.
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
echo "=== $(date -u +%H:%M:%S) setup-engine"
bash bench/gpu/run_on_gpu.sh setup-engine .gpu/model0 2>&1 | grep -v "pip as the 'root'" | tail -2
echo "=== $(date -u +%H:%M:%S) A/B: base d000384 (bursts), this 3f3017a (one at a time); process, 256, rounds 5"
SKIP_SETUP=1 STEPS=engine-ab AB_PAIRS=2 ENGINE_MODES="process" ENGINE_LIMIT_S=100 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep -v "$F"
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
