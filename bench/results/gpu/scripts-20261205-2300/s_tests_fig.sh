#!/usr/bin/env bash
# Device call (after `run_on_gpu.sh setup .gpu/model1` on the machine, staged as in docs/performance.md; carry .gpu/scripts): the CUDA tests on this tree (7e6b3a5), then
# the figures: engine thread at 1, 128 and 256 streams with transformers' compiled static generate in the same run
# (5 rounds a measurement, median of 3).
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
echo "=== $(date -u +%H:%M:%S) CUDA tests"
timeout -k 10 300 bash bench/gpu/run_on_gpu.sh test -q -p no:cacheprovider --basetemp=$R/pytest-cuda \
  tests/test_paged_attention.py tests/test_cuda_transformers.py tests/test_cuda_multi_instance.py 2>&1 | tail -15
echo "=== $(date -u +%H:%M:%S) figures: engine thread at 1, 128, 256 (rounds 5)"
SKIP_SETUP=1 STEPS=engine ENGINE_MODES=thread ENGINE_LIMIT_S=280 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 1,128,256" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
