#!/usr/bin/env bash
# Device call (after g1_setup_ab.sh on the same warm machine; carry .gpu/scripts): g2_tests.sh base|this puts that
# tree in $GPU_HOME/src, then runs the CUDA tests (paged-attention kernel, transformers executor under CUDA through
# tritonserver, multi-instance).
set -u
G=/tmp/trtllm-gpu
R=$G/results
A=$G/stage/src.tar.gz
if [ "${1:-this}" = base ]; then A=$G/stage/src-base.tar.gz; fi
echo "=== $(date -u +%H:%M:%S) tree ${1:-this}: $A"
rm -rf $G/src && mkdir -p $G/src && tar -xzf $A -C $G/src
grep -c JoinedBuckets $G/src/trtllm_model/embedded/runner.py
echo "=== $(date -u +%H:%M:%S) CUDA tests"
timeout -k 10 400 bash bench/gpu/run_on_gpu.sh test -q -p no:cacheprovider -rs --basetemp=$R/pytest-cuda \
  tests/test_paged_attention.py tests/test_cuda_transformers.py tests/test_cuda_multi_instance.py 2>&1 | tail -15
echo "=== $(date -u +%H:%M:%S) done"
