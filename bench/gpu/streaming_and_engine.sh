#!/usr/bin/env bash
# The H200 runs behind docs/history/2026-12-04-engine-on-the-h200.md's "Streaming through Triton at 256 streams" and "The engine against
# transformers' compiled generate" (issues 32 and 33), in three device calls of at most 10 minutes each, after
# the two staging calls of docs/performance.md, "How to measure" (bundle/ + numpy/, then model0/):
#
#   bench/gpu/streaming_and_engine.sh figures .gpu/model1   setup, probe, then bench/e2e.py three times (no profiler)
#   bench/gpu/streaming_and_engine.sh serving-tests         bench/serving.py --text at 1024 streams three times, then
#                                                           the CUDA tests
#   bench/gpu/streaming_and_engine.sh engine-profile        bench/engine.py --repeat 3 with the compiled baseline, then
#                                                           one bench/e2e.py run at 256 streams with py-spy (native
#                                                           frames) and the delivery timers: a profile-only run, its
#                                                           figures are not reported
#
# Results go to $RESULTS (default /tmp/trtllm-gpu/results) and are packed into $OUT/results.tgz after each step.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export GPU_HOME=${GPU_HOME:-/tmp/trtllm-gpu}
export RESULTS=${RESULTS:-$GPU_HOME/results}
export OUT=${OUT:-$GPU_HOME/out}
E2E_FIGURES="--device cuda --loads 64 256 --stagger --warmup 3 --window 8 --client-procs 4"
what=${1:?usage: streaming_and_engine.sh figures MODEL1_DIR | serving-tests | engine-profile}
shift
server_args() { TRITON_SERVER_ARGS=$(cat "$RESULTS/server_args.txt" 2>/dev/null || true); export TRITON_SERVER_ARGS; }
case "$what" in
  figures)
    STEPS="probe e2e e2e e2e" ENGINE_MODES=process E2E_ARGS="$E2E_FIGURES" bash "$HERE/measure_all.sh" "$@" ;;
  serving-tests)
    server_args
    STEPS="serving-variant serving-variant serving-variant test" SKIP_SETUP=1 \
      SERVING_VARIANT_ARGS="--models ours --text --loads 1024 --max-batch 1100 --client-procs 6 --warmup 2 --window 5 \
--idle-s 1 --in-process-samples 20 --skip-perf-analyzer --no-plot" bash "$HERE/measure_all.sh" ;;
  engine-profile)
    server_args
    STEPS="engine" SKIP_SETUP=1 ENGINE_MODES=process ENGINE_LIMIT_S=330 \
      ENGINE_ARGS="--device cuda --levels 1,128,256 --prompts 8 --sequential-prompts 8 --threads 4 --repeat 3" \
      bash "$HERE/measure_all.sh"
    PYSPY_NATIVE=1 TRTLLM_DELIVERY_TIMING_S=2 STEPS="e2e" SKIP_SETUP=1 ENGINE_MODES=process \
      E2E_ARGS="--device cuda --loads 256 --stagger --warmup 3 --window 8 --client-procs 4 --profile-s 4 --skip-in-process" \
      bash "$HERE/measure_all.sh" ;;
  *) echo "unknown: $what" >&2; exit 2 ;;
esac
