#!/usr/bin/env bash
# The GPU serving figures of docs/performance.md ("GPU serving at 256-1,024 streams"): bench/e2e.py with the product's
# defaults (no --instances: what `trtllm-triton serve` chooses on the machine), 1 / 64 / 256 / 1,024 streams, the
# engine in its worker process, in process then through Triton (one pair a device call: a call lasts at most 10
# minutes); three calls give the three pairs. After staging bundle/ + numpy/, then model0/ (docs/performance.md, "How
# to measure"):
#
#   bench/gpu/streams_defaults.sh setup .gpu/model1     install (run_on_gpu.sh setup), then one pair
#   bench/gpu/streams_defaults.sh pair                  one more pair on the same warm host
#
# Each pair's JSON, its servers' logs and this script's output go to $OUT (the device runner's folder) as a tgz.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export GPU_HOME=${GPU_HOME:-/tmp/trtllm-gpu}
export RESULTS=${RESULTS:-$GPU_HOME/results}
OUT=${OUT:-$GPU_HOME/out}
E2E_ARGS=${E2E_ARGS:---device cuda --loads 1 64 256 1024 --stagger --warmup 3 --window 6 --client-procs 6 \
--engine-process true --prompts 1024}
what=${1:?usage: streams_defaults.sh setup MODEL1_DIR | pair}
shift
mkdir -p "$OUT"
if [ "$what" = setup ]; then
  bash "$HERE/run_on_gpu.sh" setup "$@" || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) e2e $E2E_ARGS --pairs 1"
# shellcheck disable=SC2086
timeout -k 10 "${LIMIT:-500}" bash "$HERE/run_on_gpu.sh" e2e $E2E_ARGS --pairs 1
echo "=== $(date -u +%H:%M:%S) e2e exit $?"
stamp=$(date -u +%Y%m%d-%H%M%S)
(cd "$RESULTS" && tar -czf "$OUT/e2e-$stamp.tgz" e2e-*.json e2e-server-*/server.log 2>/dev/null)
