#!/usr/bin/env bash
# Device call (after `run_on_gpu.sh stage .gpu/ab/engine .gpu/ab/model1`; carry .gpu/ab/model0 .gpu/ab/scripts):
# setup-engine, then the A/B of the revert of the worker's burst admission: base d000384 (bursts taken together),
# this 919a74f (3f3017a's one command at a time), engine in its worker process, 256 streams, 5 rounds a
# measurement, median of 3, AB_PAIRS pairs (default 2), base first.
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) setup-engine"
bash bench/gpu/run_on_gpu.sh setup-engine .gpu/ab/model0 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -2
echo "=== $(date -u +%H:%M:%S) A/B: base d000384 (bursts), this 919a74f (one at a time); process, 256, rounds 5"
SKIP_SETUP=1 STEPS=engine-ab AB_PAIRS=${AB_PAIRS:-2} ENGINE_MODES="process" ENGINE_LIMIT_S=100 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
