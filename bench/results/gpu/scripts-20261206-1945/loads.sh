#!/usr/bin/env bash
# bench/e2e.py through Triton (no profiler) at each load of LOADS, one run for each entry of INSTANCES in turn (this
# tree; "1 4 1 4 1 4" gives three runs each of one instance and of four instances sharing one engine worker).
# After setup_tests.sh on the same warm machine; carry .gpu/scripts.
set -u
G=/tmp/trtllm-gpu; R=$G/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
ARGS="--device cuda --loads ${LOADS:-32 128} --stagger --warmup 3 --window 8 --client-procs 4 --skip-in-process --param engine_process=true"
nvidia-smi --query-gpu=name --format=csv,noheader
rm -f $R/e2e-*.json; rm -rf $R/e2e-server-*
mkdir -p $OUT; ( while true; do cp $R/e2e-*.json $OUT/ 2>/dev/null; sleep 5; done ) &  # a call cut short keeps its runs
COPIER=$!
for instances in ${INSTANCES:-1 4}; do
  echo "=== $(date -u +%H:%M:%S) $instances instance(s), loads ${LOADS:-32 128}"
  SKIP_SETUP=1 STEPS=e2e-ab AB_TREES=this AB_PAIRS=1 E2E_AB_ARGS="$ARGS --instances $instances" \
    bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F" | grep --line-buffered -A1 "via Triton  load\|results:"
  rm -rf $R/e2e-server-*
done
cp $R/e2e-*.json $OUT/ 2>/dev/null
kill $COPIER
echo "=== $(date -u +%H:%M:%S) done"
