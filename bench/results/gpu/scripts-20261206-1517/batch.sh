#!/usr/bin/env bash
# bench/e2e.py through Triton at 256 streams (no profiler; timers only with TIMERS=1), measure_all.sh's e2e-ab over
# the trees of TREES in turn: base dfc4bee (each prompt tokenized alone, holding the interpreter's lock), this 426a6c2
# (an execute() batch's prompts tokenized in one encode_batch call). E2E_AB_ARGS overrides the e2e arguments. SETUP=1 first installs (call 3 of a fresh machine, after staging .gpu/bundle
# .gpu/numpy, then .gpu/model0; carry .gpu/model1 .gpu/scripts).
set -u
G=/tmp/trtllm-gpu; R=$G/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${SETUP:-0}" = 1 ]; then
  echo "=== $(date -u +%H:%M:%S) setup"
  bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -1
fi
rm -f $R/e2e-*.json; rm -rf $R/e2e-server-*
if [ "${TIMERS:-0}" = 1 ]; then export TRTLLM_DELIVERY_TIMING_S=2; fi
mkdir -p $OUT; ( while true; do cp $R/e2e-*.json $OUT/ 2>/dev/null; sleep 5; done ) &  # a call cut short keeps its runs
SKIP_SETUP=1 STEPS=e2e-ab AB_TREES="$TREES" AB_PAIRS=1 bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F" \
  | grep --line-buffered -A1 "=== \|via Triton  load\|results:"
mkdir -p $OUT && cp $R/e2e-*.json $OUT/ 2>/dev/null
if [ "${TIMERS:-0}" = 1 ]; then
  for d in $R/e2e-server-*; do grep -h "delivery timing" $d/server.log > $OUT/timing-$(basename $d).txt; done
  tail -n 2 $OUT/timing-*.txt
fi
echo "=== $(date -u +%H:%M:%S) done"
