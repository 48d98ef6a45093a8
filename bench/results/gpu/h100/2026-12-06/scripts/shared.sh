#!/usr/bin/env bash
# bench/e2e.py through Triton at 256 streams (no profiler), one run for each entry of RUNS ("tree:instances", in
# turn): base 0fed4b2 (each instance its own engine worker; one instance) against this tree (the instances of one
# model on one device share one engine worker) with 1, 2 or 4 instances (instance_group count). SETUP=1 first installs
# (call 3 of a fresh machine, after staging .gpu/bundle .gpu/numpy, then .gpu/model0; carry .gpu/model1 .gpu/scripts).
set -u
G=/tmp/trtllm-gpu; R=$G/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
ARGS="--device cuda --loads 256 --stagger --warmup 3 --window 8 --client-procs 4 --skip-in-process --param engine_process=true"
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${SETUP:-0}" = 1 ]; then
  echo "=== $(date -u +%H:%M:%S) setup"
  bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -1
fi
rm -f $R/e2e-*.json; rm -rf $R/e2e-server-*
mkdir -p $OUT; ( while true; do cp $R/e2e-*.json $OUT/ 2>/dev/null; sleep 5; done ) &  # a call cut short keeps its runs
COPIER=$!
for run in $RUNS; do
  tree=${run%%:*}; instances=${run##*:}
  echo "=== $(date -u +%H:%M:%S) $tree, $instances instance(s)"
  SKIP_SETUP=1 STEPS=e2e-ab AB_TREES="$tree" AB_PAIRS=1 E2E_AB_ARGS="$ARGS --instances $instances" \
    bash bench/gpu/measure_all.sh 2>&1 | grep --line-buffered -v "$F" | grep --line-buffered -A1 "via Triton  load\|results:"
  grep -h "attached" $R/e2e-server-*/server.log 2>/dev/null | tail -n "$instances" | sed 's/^/    /'
  rm -rf $R/e2e-server-*
done
mkdir -p $OUT && cp $R/e2e-*.json $OUT/ 2>/dev/null
kill $COPIER
echo "=== $(date -u +%H:%M:%S) done"
