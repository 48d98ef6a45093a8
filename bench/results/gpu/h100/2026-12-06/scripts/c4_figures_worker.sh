#!/usr/bin/env bash
# Device call 4 (after c3 on the same warm machine, whose tree is this one again after the A/B; carry .gpu/scripts):
# the figures, engine thread at 1, 128 and 256 streams with transformers' compiled static generate in the same run
# (5 rounds a measurement, median of 3); then 256 streams in the engine worker process, whose log gives the GPU memory
# the decode graphs reserved (decode_graphs.DecodeGraphs.capture).
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
grep -c "class DecodeGraphs" /tmp/trtllm-gpu/src/trtllm_model/embedded/decode_graphs.py
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
