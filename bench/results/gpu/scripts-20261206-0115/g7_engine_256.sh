#!/usr/bin/env bash
# Device call 2 of a fresh machine, engine only (after `run_on_gpu.sh stage .gpu/engine .gpu/model1`; carry
# .gpu/model0 .gpu/scripts): setup-engine, then one process at 256 streams (engine thread, 5 rounds a measurement,
# median of 3, no compiled generate).
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) setup-engine"
bash bench/gpu/run_on_gpu.sh setup-engine .gpu/model0 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -2
grep -c JoinedBuckets /tmp/trtllm-gpu/src/trtllm_model/embedded/runner.py
SKIP_SETUP=1 STEPS=engine ENGINE_MODES=thread ENGINE_LIMIT_S=100 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
