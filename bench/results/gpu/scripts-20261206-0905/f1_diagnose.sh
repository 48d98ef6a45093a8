#!/usr/bin/env bash
# Device call 3 of a fresh machine (after `run_on_gpu.sh stage .gpu/bundle .gpu/numpy` and `stage .gpu/model0`;
# carry .gpu/model1 .gpu/scripts): setup, then where the time to first token goes through Triton at 256 streams
# (bench/e2e.py through Triton only, with the server's split and gauges): one run without a profiler, then one with
# py-spy (sampling without pausing) and the delivery timers.
set -u
R=/tmp/trtllm-gpu/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
nproc
echo "=== $(date -u +%H:%M:%S) setup"
bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -3
grep -c "server_ttft_split" /tmp/trtllm-gpu/src/bench/e2e.py
rm -f $R/e2e-*.json
A="--device cuda --loads 256 --stagger --warmup 3 --window 8 --client-procs 4 --skip-in-process"
SKIP_SETUP=1 STEPS="probe e2e" ENGINE_MODES=process E2E_ARGS="$A" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
export TRITON_SERVER_ARGS=$(cat $R/server_args.txt 2>/dev/null || true)
TRTLLM_DELIVERY_TIMING_S=2 SKIP_SETUP=1 STEPS="e2e" ENGINE_MODES=process E2E_ARGS="$A --profile-s 4" \
  bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F"
mkdir -p $OUT && cp $R/e2e-*.json $R/profile-e2e-* $OUT/ 2>/dev/null
for d in $R/e2e-server-*; do grep -h "delivery\|phase\|responses/s" $d/server.log | tail -30 > $OUT/timing-$(basename $d).txt; cp $d/server.log $OUT/server-$(basename $d).log; done
ls -la $OUT
echo "=== $(date -u +%H:%M:%S) done"
