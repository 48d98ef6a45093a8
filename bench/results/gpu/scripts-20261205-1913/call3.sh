#!/usr/bin/env bash
# Device call 3 (after staging bundle+numpy, then model0): full setup, then the CUDA tests (kernel + server tests).
set -u
G=/tmp/trtllm-gpu
R=$G/results
echo "=== $(date -u +%H:%M:%S) setup"
bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep -v "pip as the 'root'" | tail -3
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) CUDA tests"
timeout -k 10 400 bash bench/gpu/run_on_gpu.sh test -q -p no:cacheprovider --basetemp=$R/pytest-cuda \
  tests/test_paged_attention.py tests/test_cuda_transformers.py tests/test_cuda_multi_instance.py 2>&1 | tail -15
echo "=== $(date -u +%H:%M:%S) done"
