#!/usr/bin/env bash
# One-time (idempotent, quick when already done) set-up of a Debian 12 machine for ftd:
#   1. Debian packages: compilers, CMake, gRPC/protobuf, Abseil, prometheus-cpp, SQLite, GoogleTest, CLI11, JSON, PCRE2, yaml-cpp,
#      Gloo's headers (data-parallel CPU ranks),
#      and Prometheus itself (prometheus, promtool: tests/python/test_prometheus.py checks deploy/ with them),
#      and clang with its runtime libraries (libFuzzer: scripts/fuzz.sh).
#   2. A project-local virtual environment (.venv, ignored by git) with LibTorch from PyPI's torch==2.11.0,
#      and HF transformers + safetensors, which the tests use as references.
#   3. Configure and build into build/ (FTD_BUILD_DIR to change).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

debs=(build-essential cmake ninja-build pkg-config git python3 python3-venv
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
      prometheus-cpp-dev libsqlite3-dev sqlite3 libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev
      libpcre2-dev libyaml-cpp-dev openssl prometheus clang libclang-rt-dev libgloo-dev)
missing=()
for p in "${debs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

venv=$root/.venv
stamp=$venv/.ftd-requirements
if [ ! -f "$stamp" ] || ! cmp -s "$stamp" scripts/requirements.txt; then
  echo "setup: creating $venv (torch, transformers, safetensors from PyPI; the first time takes a few minutes)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r scripts/requirements.txt
  cp scripts/requirements.txt "$stamp"
fi

build=${FTD_BUILD_DIR:-$root/build}
# nvcc (the CUDA toolkit) builds the fused kernels; it is often installed off PATH.
cmake_flags=()
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  cmake_flags=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
# The GPU benchmarks (bench/) only run on a GPU: without one, they are not built.
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  cmake_flags+=(-DFTD_BUILD_BENCH=OFF)
fi
# A build directory belongs to the source tree it was configured from (CMake records its absolute
# path): after the clone moved, or build/ was copied from another clone, CMake only fails, or quietly
# builds the other tree. Such a directory is configured afresh for this one (cmake --fresh: a new
# cache, the same directory).
fresh=()
if [ -f "$build/CMakeCache.txt" ]; then
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
  if ! [ "$src/CMakeLists.txt" -ef "$root/CMakeLists.txt" ]; then
    echo "setup: $build was configured from ${src:-an unknown source tree}, not from $root (a moved or copied clone); configuring it afresh for $root" >&2
    fresh=(--fresh)
  fi
fi
if [ ! -f "$build/CMakeCache.txt" ] || ((${#fresh[@]})); then
  torch_prefix=$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  log=$(mktemp)
  cmake "${fresh[@]}" -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_flags[@]}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DPython3_EXECUTABLE="$venv/bin/python" >"$log" 2>&1 || {
    cat "$log" >&2; rm -f "$log" "$build/CMakeCache.txt"
    echo "setup: cmake configure of $build failed (log above)" >&2; exit 1; }
  rm -f "$log"
fi
cmake --build "$build" -j"$(nproc)" || { echo "setup: the build in $build failed (errors above)" >&2; exit 1; }
