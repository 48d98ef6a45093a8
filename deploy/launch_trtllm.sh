#!/usr/bin/env bash
# Start tritonserver for a TensorRT-LLM executor inside NVIDIA's Triton TensorRT-LLM container.
#
# 1. makes /opt/trtllm_triton importable by the Python backend stub (it ignores PYTHONPATH: a .pth file does not);
# 2. writes the model repository with `trtllm-triton configure` from the mounted engine or checkpoint;
# 3. runs one tritonserver, or one per MPI rank (leader mode) when WORLD_SIZE > 1 for executor=trtllm_engine, with
#    its HTTP and metrics listeners on loopback ports behind the HTTP guard (python -m trtllm_model.launch.http_guard) on
#    HTTP_PORT and METRICS_PORT; the script ends when tritonserver does, and stops it (exit 1) if the guard ends.
#
# Environment:
#   TRTLLM_EXECUTOR     trtllm_engine (default) or trtllm_llmapi
#   ENGINE_DIR          engine directory inside the container (trtllm_engine; default /engines)
#   TOKENIZER_DIR       Hugging Face tokenizer inside the container, for text requests (default /tokenizer, if it
#                       holds tokenizer_config.json or tokenizer.json)
#   CHECKPOINT_DIR      Hugging Face checkpoint inside the container (trtllm_llmapi; default /checkpoint)
#   WORLD_SIZE          MPI ranks = tensor x pipeline parallelism the engine was built with (default 1)
#   TRTLLM_ORCHESTRATOR 1: one tritonserver spawns the workers itself (no mpirun)
#   CONFIGURE_SETS      extra "key=value key=value" for the template (e.g. "kv_cache_free_gpu_mem_fraction=0.9")
#   HTTP_PORT GRPC_PORT METRICS_PORT (8000 8001 8002: HTTP and metrics are the guard's), MODEL_REPOSITORY
#                       (/tmp/model_repository)
#   EXIT_TIMEOUT_SECS   tritonserver's --exit-timeout-secs (30): how long a stop waits for the models to unload;
#                       keep Kubernetes' terminationGracePeriodSeconds above preStop time + this (docs/kubernetes.md)
#   CONFIGURE_ONLY=1    write the model repository and exit (a multi-node worker: mpirun starts its ranks)
#   OPENAI_PORT         the OpenAI-compatible API (`trtllm-triton openai`, on every interface) on this port next to
#                       tritonserver, stopped with it; unset or empty: none
#   TRTLLM_TRITON_ADMIN_KEY  the key Triton's model-repository API (load, unload, index) asks for, in the header
#                       trtllm-admin-key (gRPC: triton-grpc-protocol-trtllm-admin-key); unset: a random one per start,
#                       never printed, so nobody can load or unload models over the network (docs/security.md)
#   MPI_HOSTS           multi-node leader mode: mpirun's --host list, e.g. "leader:4,worker-1:4" (ranks fill the
#                       hosts in order); unset: every rank on this host
#   PYTHON (python3), PTH_DIR (that Python's site-packages: where the .pth file goes)
set -euo pipefail

package_root=${TRTLLM_TRITON_ROOT:-/opt/trtllm_triton}
executor=${TRTLLM_EXECUTOR:-trtllm_engine}
repository=${MODEL_REPOSITORY:-/tmp/model_repository}
world_size=${WORLD_SIZE:-1}
http_port=${HTTP_PORT:-8000}
grpc_port=${GRPC_PORT:-8001}
metrics_port=${METRICS_PORT:-8002}

python=${PYTHON:-python3}
pth_dir=${PTH_DIR:-$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}
echo "$package_root" > "$pth_dir/trtllm_triton.pth"

sets=()
case "$executor" in
  trtllm_engine)
    sets+=(--set "gpt_model_path=${ENGINE_DIR:-/engines}")
    tokenizer_dir=${TOKENIZER_DIR:-/tokenizer}
    if [ -f "$tokenizer_dir/tokenizer_config.json" ] || [ -f "$tokenizer_dir/tokenizer.json" ]; then
      sets+=(--set "tokenizer_dir=$tokenizer_dir")
    fi
    if [ "${TRTLLM_ORCHESTRATOR:-0}" = 1 ]; then
      sets+=(--set "executor_worker_path=/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker")
    fi
    ;;
  trtllm_llmapi)
    sets+=(--set "hf_model_path=${CHECKPOINT_DIR:-/checkpoint}")
    ;;
  *)
    echo "launch_trtllm.sh: TRTLLM_EXECUTOR=$executor: expected trtllm_engine or trtllm_llmapi" >&2
    exit 2
    ;;
esac
for assignment in ${CONFIGURE_SETS:-}; do sets+=(--set "$assignment"); done
PYTHONPATH="$package_root" "$python" -m trtllm_model.launch.configure --executor "$executor" --output "$repository" --force "${sets[@]}"
if [ "${CONFIGURE_ONLY:-0}" = 1 ]; then exit 0; fi

# tritonserver 2.51's HTTP server ends (SIGSEGV, every stream with it) on some requests: a ~5 MB form body, JSON
# nested 100,000 deep (trtllm_model/launch/http_guard.py says why). So, as under `trtllm-triton serve`, tritonserver's HTTP
# and metrics listeners go on loopback ports and the guard, which bounds every request before Triton reads it, takes
# the public ones; its bounds assume 8 MiB thread stacks, which tritonserver's threads get from RLIMIT_STACK (raised
# here on this shell, which tritonserver inherits, when it is lower or unlimited).
# The model-repository API runs whatever a load request uploads: only callers with the admin key may use it.
# trtllm_model.server checks the operator's key (or makes one) and writes the two tritonserver flags.
settings=$(PYTHONPATH="$package_root" "$python" -c '
import sys
from trtllm_model.server import admin_key, free_ports, restricted_api_args, set_thread_stack_limit
try:
    print(" ".join(restricted_api_args(admin_key())))
except ValueError as error:
    sys.exit(f"launch_trtllm.sh: {error}")
print(*free_ports(2))
set_thread_stack_limit(int(sys.argv[1]))' "$$")
unset TRTLLM_TRITON_ADMIN_KEY  # the models never need it
{ read -r restricted_line; read -r triton_http_port triton_metrics_port; } <<< "$settings"
read -r -a restricted <<< "$restricted_line"
serving=(--http-address=127.0.0.1 --http-port="$triton_http_port" --grpc-port="$grpc_port"
         --metrics-address=127.0.0.1 --metrics-port="$triton_metrics_port"
         --allow-metrics=true --model-control-mode=explicit '--load-model=*'
         --exit-timeout-secs="${EXIT_TIMEOUT_SECS:-30}" "${restricted[@]}")
# The models ask this endpoint whether they are still served (pb_utils.is_model_ready can crash a stub while the
# server stops: docs/reliability.md, "Stopping"): tritonserver's own, not the guard's.
export TRTLLM_TRITON_HTTP_URL=${TRTLLM_TRITON_HTTP_URL:-http://127.0.0.1:$triton_http_port}

# The OpenAI API reads the model's tokenizer through the repository (no admin key needed).
frontend=
if [ -n "${OPENAI_PORT:-}" ]; then
  PYTHONPATH="$package_root" "$python" -m trtllm_model.launch.cli openai --triton-url="127.0.0.1:$grpc_port" --host=0.0.0.0 \
    --port="$OPENAI_PORT" --model-repository="$repository" &
  frontend=$!
fi

PYTHONPATH="$package_root" "$python" -m trtllm_model.launch.http_guard --host=0.0.0.0 \
  --route="$http_port=$triton_http_port" --route="$metrics_port=$triton_metrics_port" &
guard=$!

if [ "$executor" = trtllm_engine ] && [ "$world_size" -gt 1 ] && [ "${TRTLLM_ORCHESTRATOR:-0}" != 1 ]; then
  # Leader mode: one tritonserver per rank. Rank 0 (on this host: the first of MPI_HOSTS) serves, behind the guard;
  # the others only load the model (their executor joins the engine's MPI world and never takes requests), with no
  # endpoints and their own shared memory names. mpirun passes a stop on to every rank.
  ranks=()
  for ((rank = 0; rank < world_size; rank++)); do
    if [ "$rank" -gt 0 ]; then ranks+=(:); fi
    ranks+=(-n 1 tritonserver --model-repository="$repository"
            --backend-config=python,shm-region-prefix-name="rank${rank}_")
    if [ "$rank" -eq 0 ]; then
      ranks+=("${serving[@]}")
    else
      ranks+=(--allow-http=false --allow-grpc=false --allow-metrics=false
              --model-control-mode=explicit --load-model=tensorrt_llm)
    fi
  done
  hosts=()
  if [ -n "${MPI_HOSTS:-}" ]; then hosts=(--host "$MPI_HOSTS"); fi
  mpirun --allow-run-as-root "${hosts[@]}" "${ranks[@]}" &
else
  tritonserver --model-repository="$repository" "${serving[@]}" &
fi
server=$!

# A stop (SIGTERM, Ctrl-C) goes to tritonserver (or mpirun) and the OpenAI API; the guard keeps passing the open
# streams' last responses until tritonserver has exited. tritonserver 2.51 never exits after SIGTERM while a client's
# gRPC stream is still open (docs/reliability.md, "Stopping"), so the stop would last until the kubelet's SIGKILL:
# once its exit timeout and 5 s more have passed, it and its children (backend stubs; mpirun's ranks) are killed, as
# `trtllm-triton serve` does. A guard that ends on its own stops tritonserver too, and the script exits 1: with no
# door on the public ports the container must end, for its orchestrator to start it again.
grace=$(( ${EXIT_TIMEOUT_SECS:-30} + 5 ))
stopping= killer=
stop_server() {
  if [ -n "$stopping" ]; then return; fi
  stopping=1
  kill -TERM "$server" 2>/dev/null || true
  if [ -n "$frontend" ]; then kill -TERM "$frontend" 2>/dev/null || true; fi
  ( trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    sleep "$grace" & sleeper=$!
    wait "$sleeper"
    pkill -KILL -P "$server" 2>/dev/null || true; kill -KILL "$server" 2>/dev/null || true ) &
  killer=$!
}
trap stop_server TERM INT
guard_lost=
while true; do
  wait -n -p ended "$server" ${guard:+"$guard"} && code=0 || code=$?  # a trapped signal also ends the wait
  ended=${ended:-}  # unset then
  if [ "$ended" = "$server" ]; then status=$code; break; fi
  if [ -n "$guard" ] && [ "$ended" = "$guard" ]; then
    guard=
    if [ -z "$stopping" ]; then
      echo "launch_trtllm.sh: the HTTP guard exited ($code) while serving; stopping tritonserver" >&2
      guard_lost=1
      stop_server
    fi
  fi
done
if [ -n "$killer" ]; then kill -TERM "$killer" 2>/dev/null || true; wait "$killer" 2>/dev/null || true; fi
if [ -n "$guard" ]; then kill -TERM "$guard" 2>/dev/null || true; wait "$guard" 2>/dev/null || true; fi
if [ -n "$frontend" ]; then kill -TERM "$frontend" 2>/dev/null || true; wait "$frontend" 2>/dev/null || true; fi
if [ -n "$guard_lost" ]; then status=1; fi
exit "$status"
