#!/usr/bin/env bash
# Device call after setup_tests.sh on the same warm machine (carry .gpu/scripts): the issue 33 figures, engine thread
# at 1, 128 and 256 streams with transformers' compiled static generate in the same run (5 rounds a measurement,
# median of 3); then 256 streams in the engine worker process.
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
rm -f $R/engine-*.json
echo "=== $(date -u +%H:%M:%S) figures: engine thread at 1, 128, 256 (rounds 5)"
SKIP_SETUP=1 STEPS=engine ENGINE_MODES=thread ENGINE_LIMIT_S=${LIMIT:-330} \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 1,128,256" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
echo "=== $(date -u +%H:%M:%S) worker process at 256 (rounds 5)"
SKIP_SETUP=1 STEPS=engine ENGINE_MODES=process ENGINE_LIMIT_S=110 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
