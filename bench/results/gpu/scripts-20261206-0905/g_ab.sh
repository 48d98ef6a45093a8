#!/usr/bin/env bash
# bench/e2e.py through Triton at 256 streams (no profiler, no timers), the trees in turn: g_ab.sh TREE... where TREE
# is base (the staged src-base.tar.gz) or new (src.tar.gz). SETUP=1 first installs (call 3 of a fresh machine, after
# staging .gpu/bundle .gpu/numpy, then .gpu/model0; carry .gpu/model1 .gpu/scripts).
set -u
G=/tmp/trtllm-gpu; R=$G/results
F='[Ww]arning\|warn(\|Loading weights\|I1206\|W1206'
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${SETUP:-0}" = 1 ]; then
  echo "=== $(date -u +%H:%M:%S) setup"
  bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -1
  rm -f $R/e2e-*.json
fi
A="--device cuda --loads 256 --stagger --warmup 3 --window 8 --client-procs 4 --skip-in-process --param engine_process=true"
for tree in "$@"; do
  archive=$G/stage/src.tar.gz; [ "$tree" = base ] && archive=$G/stage/src-base.tar.gz
  rm -rf $G/src && mkdir -p $G/src && tar -xzf $archive -C $G/src
  echo "=== $(date -u +%H:%M:%S) tree $tree: admission in dispatch.py: $(grep -c 'def admission' $G/src/trtllm_model/dispatch.py)"
  timeout -k 10 200 bash bench/gpu/run_on_gpu.sh e2e $A 2>&1 | grep --line-buffered -v "$F" | grep -A1 "via Triton  load\|results:"
done
rm -rf $G/src && mkdir -p $G/src && tar -xzf $G/stage/src.tar.gz -C $G/src
mkdir -p $OUT && cp $R/e2e-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
