#!/usr/bin/env bash
# Device call 3 of a fresh machine (after `run_on_gpu.sh stage .gpu/bundle .gpu/numpy`, then `stage .gpu/model0`;
# carry .gpu/model1 .gpu/scripts): full setup, then the CUDA tests on this tree, test_cuda_multi_instance.py included
# (two instances on one GPU share one engine worker: not run on a GPU before).
set -u
R=/tmp/trtllm-gpu/results
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) setup"
bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -3
echo "=== $(date -u +%H:%M:%S) CUDA tests"
timeout -k 10 420 bash bench/gpu/run_on_gpu.sh test -q -p no:cacheprovider -rs --basetemp=$R/pytest-cuda \
  tests/test_paged_attention.py tests/test_cuda_transformers.py tests/test_cuda_multi_instance.py 2>&1 | tail -15
echo "=== $(date -u +%H:%M:%S) done"
