#!/usr/bin/env bash
# On the warm machine of timers.sh (this tree in place): bench/e2e.py through Triton at 256 streams, no timers, with
# sender_threads=8 twice and sender_threads=16 once.
set -u
G=/tmp/trtllm-gpu; R=$G/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf $R/e2e-*.json $R/e2e-server-*
A="--device cuda --loads 256 --stagger --warmup 3 --window 8 --client-procs 4 --skip-in-process --param engine_process=true"
run() { echo "=== $(date -u +%H:%M:%S) $*"; timeout -k 10 200 bash bench/gpu/run_on_gpu.sh e2e $A "$@" 2>&1 | grep --line-buffered -v "$F" | grep --line-buffered -A1 "via Triton  load\|results:"; }
run --param sender_threads=8
run --param sender_threads=16
run --param sender_threads=8
mkdir -p $OUT && cp $R/e2e-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
