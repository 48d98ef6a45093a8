#!/usr/bin/env bash
# Device call (same machine): does the 256-stream level move between processes, unpinned and pinned? Four processes,
# engine thread, 256 streams, 5 rounds a measurement, median of 3 each, alternating: unpinned, then --cpus PIN, where
# PIN is gpu-local, or the first half of the CPUs when the GPU's node holds them all.
set -u
R=/tmp/trtllm-gpu/results
F='done: generate, static\|[Ww]arning\|warn(\|Loading weights'
nproc; lscpu | grep -i "numa\|model name\|socket\|thread(s) per core"
BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1)
ADDR=$(echo "${BUS: -12}" | tr 'A-F' 'a-f')
LOCAL=$(cat /sys/bus/pci/devices/$ADDR/local_cpulist 2>/dev/null); echo "GPU $BUS local_cpulist: $LOCAL"
PIN=gpu-local
if [ "$LOCAL" = "0-$(( $(nproc --all) - 1 ))" ] || [ -z "$LOCAL" ]; then PIN="0-$(( $(nproc --all) / 2 - 1 ))"; fi
echo "=== pinned runs use --cpus $PIN"
for i in 1 2; do
  for cpus in none "$PIN"; do
    extra=""; [ "$cpus" != none ] && extra="--cpus $cpus"
    SKIP_SETUP=1 STEPS=engine ENGINE_MODES=thread ENGINE_LIMIT_S=90 \
      ENGINE_ARGS="--device cuda --prompts 8 --threads 4 --repeat 3 --rounds 5 --skip-sequential --levels 256 --no-compiled-static $extra" \
      bash bench/gpu/measure_all.sh 2>&1 | grep -v "$F" | grep "===\|on .* CPUs\|done: executor\|iterations\|^| executor"
  done
done
mkdir -p $OUT && cp $R/engine-*.json $OUT/ 2>/dev/null
echo "=== $(date -u +%H:%M:%S) done"
