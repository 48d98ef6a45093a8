#!/usr/bin/env bash
# Device call (after call3.sh on the same machine): the figures, engine thread at 1, 128 and 256 streams with
# transformers' compiled static generate in the same run (5 rounds a measurement, median of 3); then the engine in
# its worker process at 256 (5 rounds, median of 3).
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
echo "=== $(date -u +%H:%M:%S) figures: engine thread at 1, 128, 256 (rounds 5)"
SKIP_SETUP=1 STEPS=engine ENGINE_MODES=thread ENGINE_LIMIT_S=300 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 1,128,256" \
  bash bench/gpu/measure_all.sh 2>&1 | grep -v "$F"
echo "=== $(date -u +%H:%M:%S) worker process at 256 (rounds 5)"
SKIP_SETUP=1 STEPS=engine ENGINE_MODES=process ENGINE_LIMIT_S=100 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep -v "$F"
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
