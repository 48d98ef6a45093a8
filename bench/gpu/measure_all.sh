#!/usr/bin/env bash
# Every GPU measurement of docs/performance.md in one pass, on a GPU host (setup included):
#
#   bench/gpu/measure_all.sh BUNDLE_DIR [MODEL_DIR...]       (the directories bench/gpu/make_bundle.sh wrote)
#
# Steps (STEPS="probe sanity serving e2e test engine engine-profile serving-variant" by default; probe: bench/gpu/probe_outputs.py picks the
# tritonserver flags for every later server; sanity: the synthetic streaming e2e tests), each under its own time limit, each writing to $RESULTS;
# the results are packed into $OUT/results.tgz after every step, so a cut-short run still returns what it had.
# ENGINE_ARGS, SERVING_ARGS, E2E_ARGS replace each benchmark's arguments.
# ENGINE_LIMIT_S: the engine step's time limit (default 110 s; the compiled baseline needs more).
# ENGINE_MODES="process thread" (default: both, in that order) runs the engine, engine-profile and e2e steps once per
# layout of the embedded engine: in its worker process (config engine_process=true, bench/engine.py --engine-process)
# or on a thread of the stub (engine_process=false). DRY_RUN=1 prints each step's command instead of running it.
# The test step runs tests/test_cuda_transformers.py and tests/test_cuda_multi_instance.py.
# engine-ab (not in the default STEPS): the engine step from the bundle's base tree (make_bundle.sh with AB_BASE=<commit>)
# and from this one, in turn, AB_PAIRS times (default 2), each in every ENGINE_MODES layout; the tree is swapped in
# $GPU_HOME/src, where the stub's links point, and this one is left in place at the end.
# e2e-ab (not in the default STEPS): the same for bench/e2e.py through Triton only (E2E_AB_ARGS, default 256 streams,
# the engine in its worker process), each tree of AB_TREES in turn (default "base this"; "base other this" with
# make_bundle.sh's AB_OTHER=<commit>), AB_PAIRS times: each run about 70-130 s on an H100.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RUN="$HERE/run_on_gpu.sh"
export GPU_HOME=${GPU_HOME:-/tmp/trtllm-gpu}
export RESULTS=${RESULTS:-$GPU_HOME/results}
OUT=${OUT:-$GPU_HOME/out}
STEPS=${STEPS:-probe sanity serving e2e test engine engine-profile serving-variant}
ENGINE_ARGS=${ENGINE_ARGS:---device cuda --levels 1,32,128,256 --prompts 8 --sequential-prompts 8 --threads 4}
SERVING_ARGS=${SERVING_ARGS:---loads 0 64 256 512 1024 --max-batch 1100 --client-procs 6 --warmup 2 --window 5 \
--idle-s 2 --in-process-samples 50 --skip-perf-analyzer --no-plot --quiet-timeout 5 --profile-s 4}
E2E_ARGS=${E2E_ARGS:---device cuda --loads 64 256 --warmup 3 --window 8 --client-procs 4 --profile-s 4}
E2E_AB_ARGS=${E2E_AB_ARGS:---device cuda --loads 256 --stagger --warmup 3 --window 8 --client-procs 4 --skip-in-process \
--param engine_process=true}
ENGINE_MODES=${ENGINE_MODES:-process thread}
DRY=""
if [ "${DRY_RUN:-0}" = 1 ]; then DRY=echo; fi
mkdir -p "$OUT" "$RESULTS"

engine_flag() { [ "$1" = process ] && echo --engine-process; }
engine_param() { [ "$1" = process ] && echo engine_process=true || echo engine_process=false; }

# SKIP_SETUP=1: a later call on a host that still has the installation of an earlier one (saves its ~40 s).
# setup also caches the dequantised SmolLM2, so no model's initialize() has to make it.
if [ "${SKIP_SETUP:-0}" != 1 ]; then $DRY "$RUN" setup "$@" || exit 1; fi
pack() { tar -czf "$OUT/results.tgz" -C "$RESULTS" . ; }
use_tree() {  # use_tree base|other|this: that tree's code in $GPU_HOME/src
  local archive="$GPU_HOME/stage/src.tar.gz"
  if [ "$1" != this ]; then archive="$GPU_HOME/stage/src-$1.tar.gz"; fi
  if [ ! -s "$archive" ] && [ -z "$DRY" ]; then echo "=== no $archive (make_bundle.sh with AB_BASE=<commit>)"; return 1; fi
  echo "=== $(date -u +%H:%M:%S) tree: $1 ($archive)"
  $DRY rm -rf "$GPU_HOME/src"
  $DRY mkdir -p "$GPU_HOME/src"
  $DRY tar -xzf "$archive" -C "$GPU_HOME/src"
}
step() {  # step LIMIT_S NAME ARGS...
  local limit=$1; shift
  echo "=== $(date -u +%H:%M:%S) $*"
  $DRY timeout -k 10 "$limit" "$RUN" "$@"
  local rc=$?
  echo "=== $(date -u +%H:%M:%S) $1 exit $rc"
  pack
}

echo "=== host: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
$DRY nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
$DRY "$RUN" python -c 'import torch, transformers, numpy; print("torch", torch.__version__, "cuda", torch.version.cuda,
"transformers", transformers.__version__, "numpy", numpy.__version__)'
for name in $STEPS; do
  case "$name" in
    probe)  # which tritonserver flags deliver output tensors here (see bench/gpu/probe_outputs.py)
      step 120 python bench/gpu/probe_outputs.py --write "$RESULTS/server_args.txt" --results-dir "$RESULTS"
      TRITON_SERVER_ARGS=$(cat "$RESULTS/server_args.txt" 2>/dev/null || true)
      export TRITON_SERVER_ARGS
      echo "=== TRITON_SERVER_ARGS=$TRITON_SERVER_ARGS" ;;
    sanity) step 90 test -q -x -p no:cacheprovider --basetemp="$RESULTS/pytest-sanity" tests/test_e2e_streaming.py ;;
    test) step 240 test -q -x -s -p no:cacheprovider --basetemp="$RESULTS/pytest-cuda" tests/test_cuda_transformers.py \
tests/test_cuda_multi_instance.py ;;
    engine) for mode in $ENGINE_MODES; do step "${ENGINE_LIMIT_S:-110}" engine $ENGINE_ARGS $(engine_flag "$mode"); done ;;
    engine-profile)  # where the engine's time goes at 128 requests in flight (py-spy, sampling without pausing)
      for mode in $ENGINE_MODES; do
        step 90 exec py-spy record --nonblocking --threads --subprocesses -r 100 -f raw \
          -o "$RESULTS/profile-engine-128-$mode.txt" -- "${PYTHON:-python3}" -P bench/engine.py --device cuda \
          --levels 128 --prompts 128 --skip-sequential --threads 4 $(engine_flag "$mode")
      done ;;
    engine-ab)
      for _ in $(seq "${AB_PAIRS:-2}"); do
        for tree in ${AB_TREES:-base this}; do
          use_tree "$tree" || break 2
          for mode in $ENGINE_MODES; do step "${ENGINE_LIMIT_S:-110}" engine $ENGINE_ARGS $(engine_flag "$mode"); done
        done
      done
      use_tree this ;;
    e2e-ab)
      for _ in $(seq "${AB_PAIRS:-2}"); do
        for tree in ${AB_TREES:-base this}; do
          use_tree "$tree" || break 2
          step 200 e2e $E2E_AB_ARGS
        done
      done
      use_tree this ;;
    serving) step 230 serving $SERVING_ARGS ;;
    serving-variant) step 60 serving ${SERVING_VARIANT_ARGS:---models ours --loads 1024 --max-batch 1100 --client-procs 6 \
--warmup 2 --window 5 --idle-s 1 --in-process-samples 20 --skip-perf-analyzer --no-plot --param sender_threads=8} ;;
    e2e)  # bench/e2e.py names its profiles by load only: the mode is added so the next mode's run keeps them
      for mode in $ENGINE_MODES; do
        step 300 e2e $E2E_ARGS --param "$(engine_param "$mode")"  # two engine starts (in process, then the server), each capturing its graphs (about 30 s on an H100)
        for f in "$RESULTS"/profile-e2e-*.txt; do
          case "$f" in *-process.txt|*-thread.txt) ;; *) [ -e "$f" ] && $DRY mv "$f" "${f%.txt}-$mode.txt" ;; esac
        done
        pack
      done ;;
    *) echo "unknown step $name" ;;
  esac
done
