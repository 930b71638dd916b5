#!/usr/bin/env bash
# Installs llama.cpp's Python binding (llama-cpp-python, built from source with this
# machine's compiler, a few minutes) into its own virtual environment and prints the
# environment's python. Only the benchmarks use it: `bench/engine_throughput.py
# --single-stream` runs llama.cpp on the same GGUF as Frota's int4 path.
#
#   scripts/llama-env.sh           # -> ~/.cache/frota-llama/<version>/bin/python
#   LLAMA_CPP_VERSION=0.3.36 LLAMA_ENV=DIR scripts/llama-env.sh
set -euo pipefail

version="${LLAMA_CPP_VERSION:-0.3.36}"
env_dir="${LLAMA_ENV:-$HOME/.cache/frota-llama/$version}"
stamp="$env_dir/.frota-installed"
if [[ -f "$stamp" ]]; then
    echo "$env_dir/bin/python"
    exit 0
fi
echo "llama-env: building llama-cpp-python $version into $env_dir" >&2
"${PYTHON:-python3}" -m venv "$env_dir"
# GGML_NATIVE: llama.cpp's kernels for this CPU, as Frota's own are built (-march=native).
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$env_dir/bin/pip" install --quiet --disable-pip-version-check "llama-cpp-python==$version" >&2
touch "$stamp"
echo "$env_dir/bin/python"
