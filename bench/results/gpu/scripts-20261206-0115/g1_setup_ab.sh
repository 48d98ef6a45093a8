#!/usr/bin/env bash
# Device call 3 (after `run_on_gpu.sh stage .gpu/bundle .gpu/numpy` and `stage .gpu/model0`; carry .gpu/model1 .gpu/scripts):
# full setup, then the A/B of the joined buckets: base 545da49 (main: a burst's prompts beyond the 512-row decode
# buckets prefill in an eager prompt forward), this e64f3af (main + the revert of 147b15c: they join the decode step's
# graph as rows), engine on a thread, 256 streams, 5 rounds a measurement, median of 3, AB_PAIRS pairs, base first.
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) setup"
bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -3
echo "=== $(date -u +%H:%M:%S) A/B joined buckets: base 545da49, this e64f3af; thread, 256, rounds 5"
SKIP_SETUP=1 STEPS=engine-ab AB_PAIRS=${AB_PAIRS:-2} ENGINE_MODES="thread" ENGINE_LIMIT_S=110 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
