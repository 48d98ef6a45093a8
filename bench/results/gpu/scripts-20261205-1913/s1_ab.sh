#!/usr/bin/env bash
# Device call (after call3.sh on the same machine): the worker burst change A/B (base e619859, before 569745b, then
# this tree), engine in its worker process, 256 streams, 5 rounds a measurement, median of 3, two pairs; then a
# py-spy profile (raw, 100 Hz, not a figure) of the worker and of the thread at 256.
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
echo "=== $(date -u +%H:%M:%S) A/B worker bursts (process, 256, rounds 5), 2 pairs"
SKIP_SETUP=1 STEPS=engine-ab AB_PAIRS=2 ENGINE_MODES="process" ENGINE_LIMIT_S=100 \
  ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static" \
  bash bench/gpu/measure_all.sh 2>&1 | grep -v "$F"
for mode in process thread; do
  flag=""; [ $mode = process ] && flag=--engine-process
  echo "=== $(date -u +%H:%M:%S) py-spy profile, $mode, 256"
  timeout -k 5 90 bash bench/gpu/run_on_gpu.sh exec py-spy record --nonblocking --threads --subprocesses -r 100 -f raw \
    -o $R/profile-engine-256-$mode.txt -- python3 -P bench/engine.py --device cuda --levels 256 --prompts 8 \
    --skip-sequential --threads 4 --rounds 5 --no-compiled-static $flag 2>&1 | grep -v "$F" | tail -4
done
mkdir -p $OUT && cp $R/engine-*.json $R/profile-engine-256-*.txt $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
