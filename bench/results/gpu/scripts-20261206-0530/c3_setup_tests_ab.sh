#!/usr/bin/env bash
# Device call 3 of a fresh machine (after `run_on_gpu.sh stage .gpu/bundle .gpu/numpy` and `stage .gpu/model0`;
# carry .gpu/model1 .gpu/scripts): full setup, the CUDA tests on this tree (decode_graphs.py split out of runner.py),
# then the 256-stream A/B against 404c9bc (before the split): engine thread, 5 rounds a measurement, median of 3, one
# pair, base first.
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) setup"
bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -3
grep -c "class DecodeGraphs" /tmp/trtllm-gpu/src/trtllm_model/embedded/decode_graphs.py
echo "=== $(date -u +%H:%M:%S) CUDA tests"
timeout -k 10 400 bash bench/gpu/run_on_gpu.sh test -q -p no:cacheprovider -rs --basetemp=$R/pytest-cuda \
  tests/test_paged_attention.py tests/test_cuda_transformers.py tests/test_cuda_multi_instance.py 2>&1 | tail -15
echo "=== $(date -u +%H:%M:%S) A/B: base 404c9bc, this (the split); thread, 256, rounds 5"
rm -f $R/engine-*.json
SKIP_SETUP=1 STEPS=engine-ab AB_PAIRS=1 ENGINE_MODES="thread" ENGINE_LIMIT_S=110 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
