#!/usr/bin/env bash
# Build + every test (GPU ones included) + the end-to-end training benchmark, in one go, on a GPU
# machine whose python3 has torch 2.11 (CUDA) and transformers. Debian packages the machine lacks
# (gRPC, Abseil, prometheus-cpp, GoogleTest, CLI11, JSON) come unpacked from .devdeps/ when present
# (scripts/fetch-gpu-deps.sh fills it). Results go to $OUT (default: gpu-out/).
#   scripts/gpu.sh [all|build|test|default|bench]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
what=${1:-all}
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
build=$root/build-gpu
if [ -x .devdeps/install.sh ]; then bash .devdeps/install.sh || exit 1; fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' | tee -a "$out/gpu.txt"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    -DPython3_EXECUTABLE="$(command -v python3)" > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
fi
cmake --build "$build" -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error|Error" -A5 "$out/build.log" | head -60; exit 1; }
echo "build ok"
rc=0
if [ "$what" = all ] || [ "$what" = test ]; then
  (cd "$build" && ctest --output-on-failure -j4 2>&1) > "$out/ctest.log"; rc=$?
  tail -15 "$out/ctest.log"
fi
if [ "$what" = all ] || [ "$what" = default ]; then
  # The README's main job on its embedded default (the 8B shape on a GPU), shortened.
  "$build/worker/ftd-worker" run --default --format text --set steps=${DEFAULT_STEPS:-10} 2>&1 | tee "$out/default-job.log" | tail -4
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --out "$out" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
fi
exit $rc
