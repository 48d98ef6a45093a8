#!/usr/bin/env bash
# Device call 2, engine only (after `run_on_gpu.sh stage .gpu/engine .gpu/model1`; carry .gpu/model0 .gpu/scripts):
# setup-engine, the paged-attention kernel's CUDA tests, then the A/B of the joined buckets: base 919a74f (a burst's
# prompts beyond the 512-row decode buckets prefill in an eager prompt forward), this 7e6b3a5 (473860a: they join the
# decode step's graph as rows; + the norm rounding as transformers'), engine on a thread, 256 streams, 5 rounds a
# measurement, median of 3, AB_PAIRS pairs (default 2), base first.
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) setup-engine"
bash bench/gpu/run_on_gpu.sh setup-engine .gpu/model0 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -2
echo "=== $(date -u +%H:%M:%S) A/B joined buckets: base 919a74f, this 7e6b3a5; thread, 256, rounds 5"
SKIP_SETUP=1 STEPS=engine-ab AB_PAIRS=${AB_PAIRS:-2} ENGINE_MODES="thread" ENGINE_LIMIT_S=110 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
echo "=== $(date -u +%H:%M:%S) CUDA kernel tests (this tree)"
timeout -k 10 120 bash bench/gpu/run_on_gpu.sh test -q -p no:cacheprovider tests/test_paged_attention.py 2>&1 | tail -4
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
