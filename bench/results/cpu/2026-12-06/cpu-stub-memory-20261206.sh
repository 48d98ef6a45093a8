#!/usr/bin/env bash
# Host memory of each process of `trtllm-triton serve` on this CPU machine, with 1 and with 4 instances sharing one
# engine worker (engine_process=true), idle after one request: RSS and PSS (shared pages split between processes) from
# /proc/PID/smaps_rollup. Run from the repository root: bash bench/results/cpu/2026-12-06/cpu-stub-memory-20261206.sh
set -u
for n in 1 4; do
  .venv/bin/trtllm-triton serve --instances $n --set engine_process=true --http-port 18000 --grpc-port 18001 \
    --metrics-port 18002 --no-openai > /tmp/stub-memory-$n.log 2>&1 &
  serve=$!
  for _ in $(seq 300); do curl -sf localhost:18000/v2/models/tensorrt_llm/ready && break; sleep 1; done
  curl -s -X POST localhost:18000/v2/models/ensemble/generate \
    -d '{"text_input": "The capital of France is", "max_tokens": 8}' > /dev/null
  sleep 2
  echo "=== $n instance(s)"
  printf "%-34s %8s %8s\n" process "RSS MiB" "PSS MiB"
  for pid in $(pgrep -f "tritonserver|triton_python_backend_stub|engine_worker import main"); do
    cmd=$(tr '\0' ' ' < /proc/$pid/cmdline)
    case "$cmd" in
      *engine_worker*) name="engine worker";;
      *triton_python_backend_stub*) name="stub $(echo "$cmd" | grep -o '[a-z_]*/1/model.py' | cut -d/ -f1)";;
      *) name=tritonserver;;
    esac
    awk -v n="$name" '/^Rss:/ {r=$2} /^Pss:/ {p=$2} END {printf "%-34s %8.0f %8.0f\n", n, r/1024, p/1024}' /proc/$pid/smaps_rollup
  done
  kill -INT $serve; wait $serve
done
