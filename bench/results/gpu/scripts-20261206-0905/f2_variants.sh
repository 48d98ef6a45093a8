#!/usr/bin/env bash
# Device call 3 of a fresh machine (after staging .gpu/bundle .gpu/numpy, then .gpu/model0; carry .gpu/model1
# .gpu/scripts): setup, then bench/e2e.py through Triton at 256 streams with the delivery timers (execute() wall and
# CPU), in three variants: the defaults, sender_threads=1, the stub's switch interval at 0.5 ms (an experiment hook).
set -u
R=/tmp/trtllm-gpu/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) setup"
bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -1
rm -f $R/e2e-*.json
A="--device cuda --loads 256 --stagger --warmup 3 --window 8 --client-procs 4 --skip-in-process"
export TRTLLM_DELIVERY_TIMING_S=2
SKIP_SETUP=1 STEPS="probe e2e" ENGINE_MODES=process E2E_ARGS="$A" bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
export TRITON_SERVER_ARGS=$(cat $R/server_args.txt 2>/dev/null || true)
SKIP_SETUP=1 STEPS="e2e" ENGINE_MODES=process E2E_ARGS="$A --param sender_threads=1" bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
EXPERIMENT_SWITCH_INTERVAL_S=0.0005 SKIP_SETUP=1 STEPS="e2e" ENGINE_MODES=process E2E_ARGS="$A" bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/e2e-*.json $OUT/ 2>/dev/null
for d in $R/e2e-server-*; do grep -h "delivery timing" $d/server.log > $OUT/timing-$(basename $d).txt; done
tail -n 3 $OUT/timing-*.txt
echo "=== $(date -u +%H:%M:%S) done"
