#!/usr/bin/env bash
# Device call 3 of a fresh machine (after `stage .gpu/bundle .gpu/numpy` and `stage .gpu/model0`; carry .gpu/model1
# .gpu/scripts): full setup, then the CUDA tests on this tree (g2_tests.sh this).
set -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "=== $(date -u +%H:%M:%S) setup"
bash bench/gpu/run_on_gpu.sh setup .gpu/model1 2>&1 | grep --line-buffered -v "pip as the 'root'" | tail -3
bash "$(dirname "$0")/g2_tests.sh" this
