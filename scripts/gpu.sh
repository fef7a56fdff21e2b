#!/usr/bin/env bash
# On a GPU machine whose python3 has torch 2.11 (CUDA) and transformers: builds ftd, runs the GPU
# tests and the benchmarks, in one go. Debian packages the machine lacks (gRPC, Abseil,
# prometheus-cpp, GoogleTest, CLI11, JSON) come unpacked from .devdeps/ when present
# (scripts/fetch-gpu-deps.sh fills it on a development machine). Results go to $OUT (default gpu-out/).
#   scripts/gpu.sh [STAGE...]    stages, run in the order given: build test kbench e2e lora data service
#                                profile ckpt pack dist dist-levers ab fp8 perf perf-long perf-peers perf-levers lora-ac breakdown
#                                fp8-breakdown
#                                roofline fp8-curve default (none given: build test kbench e2e lora service profile)
#   breakdown: one step's device time by category (GEMM, attention, cross-entropy, optimizer,
#       elementwise/norm/rope, communication, idle) from PROFILE jobs, fused set, 4x2048 and 1x512
#       (bench/profile_breakdown.py; BREAKDOWN_ARGS: more flags).
#   fp8-breakdown: one step of ftd fp8, ftd fused and HF + torchao float8 at 4x2048 (FP8_BREAKDOWN_SHAPE),
#       kernel by kernel on one set of categories (GEMM bf16 / fp8, casts, attention, ...), from ftd's PROFILE
#       traces and torch.profiler's (bench/profile_breakdown.py --trace).
#   roofline: per shape, the matrix work's FLOP-bound time at the measured bf16 GEMM peak plus the
#       optimizer's bytes-bound time at the measured copy bandwidth, against the measured step
#       (bench/roofline.py; the perf/perf-long stages' results when run before it in the same $OUT).
#   ckpt: the 8B checkpoint's write and load GB/s beside the raw write rate of the same disk (the
#       same bytes in 64 MiB writes, one fsync), and the cancel-to-exit latency, during a step and
#       during a checkpoint write (bench/ckpt_bench.py; its ~48.2 GB checkpoint and raw-rate file go
#       under CKPT_ROOT, default /tmp, never under $OUT; it stops at once, naming free and needed GB,
#       where they do not fit).
#   fp8: ftd's fp8 set against its bf16 fused set and HF + torchao float8 (compiled per layer) at 4x2048,
#       8x2048, 2x8192 (bench/train_bench.py; about 6 minutes on an H200, estimated; FP8_ARGS: more flags).
#       A run that does not fit is run with activation checkpointing (ftd: selective, then full after an
#       out-of-memory run; HF: gradient checkpointing where its estimate does not fit); the table says which.
#   fp8-curve: the 300-step loss curves of the fp8 and bf16 fused sets side by side, and the resume under
#       fp8 (tests/python/test_gpu_fp8.py, its printed curves kept in fp8_curve.log).
#   pack: two 8B LoRA jobs sharing GPU 0 through ftd (--jobs-per-gpu 2) against one alone (PACK_ARGS:
#       bench/pack_bench.py flags).
#   dist: data parallel on a host with 2+ GPUs (DIST_GPUS, default 2): distributed_gpu_test (NCCL ranks
#       against one process, fp32 and bf16), the NCCL all-reduce bandwidth (bench/allreduce_bw.py), then
#       bench/dist_bench.py (4x2048 per GPU, 1 vs N GPUs, unsharded, ZeRO-1 and ZeRO-2: the 8B with full
#       activation checkpointing, and the 8B shape with 16 layers; DIST_ARGS: more flags). Fails when a
#       test or a run fails or ZeRO-1 or ZeRO-2 departs from unsharded.
#   dist-levers: the communication levers on 2+ GPUs (bench/dist_bench.py --variant, the 8B with full
#       activation checkpointing at 4x2048 per GPU): 1 GPU, N GPUs, ZeRO-1 and ZeRO-2 as in dist, then N GPUs with
#       25 MiB buckets copied flat (the earlier defaults), the flat copy alone, 512 MiB buckets, 16 NCCL channels,
#       ZeRO-1 with the coalesced gather, ZeRO-2 with 25 MiB buckets, and N independent 1-GPU jobs at once
#       (--singles: the host's ceiling); about 3 minutes after the build on 4 H100s.
#   ab: this tree's ftd-worker against another version's, the 8B fused step in one invocation
#       (BASE_SRC: that version's source tree, e.g. `git archive REV | tar x -C base-src`;
#       AB_ARGS: bench/train_bench.py flags, default --shapes 4x2048 --repeat 3).
# Environment: BENCH_ARGS (bench/train_bench.py flags), LORA_ARGS (bench/lora_bench.py flags),
# DATA_ARGS (bench/data_bench.py flags), CKPT_ARGS (bench/ckpt_bench.py flags),
# KBENCH_ARGS (ftd-kernel-bench flags),
# CUDA_ARCHS (default "90;100;103": the H100/H200 and the B200/GB300 in one binary).
# A stage whose command fails makes the script exit 1 (the stages after it still run).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test kbench e2e lora service profile)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
build=$root/build-gpu
export PYTHONUNBUFFERED=1
if [ -x .devdeps/install.sh ]; then bash .devdeps/install.sh >/dev/null || exit 1; fi
# Python packages the machine lacks (pytest for the GPU tests), carried as wheels in .whl/.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ftd-site .whl/*.whl \
    && export PYTHONPATH=/tmp/ftd-site${PYTHONPATH:+:$PYTHONPATH}
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
rc=0
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
t0=$(date +%s)
stamp() { echo "[gpu.sh +$(( $(date +%s) - t0 ))s] $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
ngpus=$(nvidia-smi -L | grep -c "^GPU")
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' | tee -a "$out/gpu.txt"

build_ftd() {
  stamp "build"
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90;100;103}" \
      -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
      -DPython3_EXECUTABLE="$(command -v python3)" > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
  fi
  cmake --build "$build" -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error|Error" -A5 "$out/build.log" | head -60; exit 1; }
  stamp "build ok"
}
[ -x "$build/worker/ftd-worker" ] || has build || build_ftd
for stage in "${stages[@]}"; do
  case "$stage" in
    build) build_ftd ;;
    test)
      stamp "GPU tests"
      # On a GPU machine no GPU test may skip: FTD_TEST_NO_SKIP turns any skipped case into a failure
      # (tests/gtest_main.cc, tests/python/conftest.py), and a test ctest reports as Skipped fails the stage.
      # distributed_gpu_test needs 2 GPUs: on a host with one it is left out (the dist stage runs it).
      skip2=(); [ "$ngpus" -ge 2 ] || { skip2=(-E '^distributed_gpu_test$'); echo "gpu.sh: 1 GPU: distributed_gpu_test left out"; }
      (cd "$build" && FTD_TEST_NO_SKIP=1 ctest -L gpu "${skip2[@]}" --output-on-failure -j1 --timeout 900 2>&1) \
        > "$out/ctest-gpu.log" || rc=1
      if grep -qE "\(Skipped\)|Not Run" "$out/ctest-gpu.log"; then
        echo "gpu.sh: GPU tests skipped on a GPU machine"; rc=1
      fi
      grep -E "Test +#|tests passed|tests failed|FAILED|Failed|Error|assert|skipped" "$out/ctest-gpu.log" | head -60 ;;
    kbench)
      stamp "kernel benchmark"
      "$build/bench/ftd-kernel-bench" --json "$out/kernel_bench.json" ${KBENCH_ARGS:-} > "$out/kernel_bench.md" \
        2> "$out/kernel_bench.err" || { tail -20 "$out/kernel_bench.err"; rc=1; }
      cat "$out/kernel_bench.md" ;;
    e2e)
      stamp "end-to-end training benchmark"
      python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --out "$out" ${BENCH_ARGS:-} 2>&1 \
        | tee "$out/train_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    lora)
      stamp "LoRA benchmark: ftd eager, ftd fused, HF + PEFT; measured vs predicted peak memory"
      python3 bench/lora_bench.py --worker "$build/worker/ftd-worker" --out "$out" \
        --impls eager,fused,fused-lora-eager,fused+ac=selective+fcl=16,fused+ac=selective+fcl=18,hf ${LORA_ARGS:-} 2>&1 \
        | tee "$out/lora_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    data)
      stamp "chat JSONL benchmark: ftd packed, ftd padded, HF + its data collator"
      python3 bench/data_bench.py --worker "$build/worker/ftd-worker" --out "$out/data" ${DATA_ARGS:-} 2>&1 \
        | tee "$out/data_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    service)
      stamp "through ftd and ftctl vs standalone"
      python3 bench/service_bench.py --build "$build" --out "$out" ${SERVICE_ARGS:-} 2>&1 | tee "$out/service_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    profile)
      stamp "profiles"
      python3 bench/profile_bench.py --build "$build" --out "$out" ${PROFILE_ARGS:-} 2>&1 | tee "$out/profile_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    ckpt)
      stamp "8B checkpoint write/load and cancel latency"
      python3 bench/ckpt_bench.py --worker "$build/worker/ftd-worker" --out "$out/ckpt" --ckpt-root "${CKPT_ROOT:-/tmp}" \
        ${CKPT_ARGS:-} 2>&1 | tee "$out/ckpt_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    pack)
      stamp "two 8B LoRA jobs on one GPU through ftd, against one alone"
      python3 bench/pack_bench.py --build "$build" --out "$out" ${PACK_ARGS:-} 2>&1 | tee "$out/pack_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    dist)
      # Needs a host with 2+ GPUs (nvidia-h100-x2 / nvidia-h200-x2); about 5 minutes after the build (estimated).
      if [ "$ngpus" -lt 2 ]; then echo "gpu.sh: the dist stage needs 2+ GPUs; this host has $ngpus"; rc=1; continue; fi
      stamp "data parallel: NCCL correctness (2 ranks = 1 process at the combined batch, fp32 and bf16; ZeRO-1, ZeRO-2; resume)"
      (cd "$build" && FTD_TEST_NO_SKIP=1 ctest -R '^distributed_gpu_test$' --output-on-failure --timeout 600 2>&1) \
        > "$out/dist_test.log" || { rc=1; echo "gpu.sh: distributed_gpu_test FAILED"; }
      grep -E "passed|failed|error|assert|Tests? +#|tests passed" "$out/dist_test.log" | tail -12
      stamp "NCCL all-reduce bandwidth between ${DIST_GPUS:-2} GPUs (docs/distributed.md's B_nvl)"
      timeout 300 python3 bench/allreduce_bw.py --out "$out" --gpus "${DIST_GPUS:-2}" 2>&1 | tee "$out/allreduce_bw.log" | tail -6
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      # 1 vs N GPUs at 4x2048 per GPU, unsharded, ZeRO-1 and ZeRO-2, in two sizes that fit an 80 GB card:
      # the 8B with full activation checkpointing, and the 8B's layer shape at half depth without.
      for cfg in "8b-ac-full:--ac full" "8b-shape-16-layers:--layers 16"; do
        name=${cfg%%:*}
        stamp "data parallel bench: $name, 1 vs ${DIST_GPUS:-2} GPUs, unsharded, ZeRO-1 and ZeRO-2"
        # shellcheck disable=SC2086
        python3 bench/dist_bench.py --worker "$build/worker/ftd-worker" --out "$out/dist-$name" --gpus "${DIST_GPUS:-2}" \
          --steps 8 --timeout 150 ${cfg#*:} ${DIST_ARGS:-} 2>&1 | tee "$out/dist-$name.log" | grep -v "^{"
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      done ;;
    dist-levers)
      if [ "$ngpus" -lt 2 ]; then echo "gpu.sh: the dist-levers stage needs 2+ GPUs; this host has $ngpus"; rc=1; continue; fi
      stamp "data parallel levers: 8B, full checkpointing, 1 vs ${DIST_GPUS:-2} GPUs, then one run per lever"
      levers=(--singles --variant "b25-flat:--bucket-mib=25 --flat-reduce" --variant "flat:--flat-reduce"
              --variant "b512:--bucket-mib=512" --variant "ch16:NCCL_MAX_NCHANNELS=16"
              --variant "z1-coal:zero1 --coalesced-gather" --variant "z2-b25:zero2 --bucket-mib=25")
      python3 bench/dist_bench.py --worker "$build/worker/ftd-worker" --out "$out/dist-levers" --gpus "${DIST_GPUS:-2}" \
        --steps 8 --timeout 150 --ac full "${levers[@]}" 2>&1 | tee "$out/dist-levers.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    ab)
      stamp "this build against ${BASE_SRC:-base-src}"
      base_build=$root/build-base
      cmake -S "${BASE_SRC:-base-src}" -B "$base_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90;100;103}" -DFTD_BUILD_BENCH=OFF \
        -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
        -DPython3_EXECUTABLE="$(command -v python3)" > "$out/configure-base.log" 2>&1 \
        && cmake --build "$base_build" -j"$(nproc)" --target ftd-worker > "$out/build-base.log" 2>&1 \
        || { tail -30 "$out/configure-base.log" "$out/build-base.log"; exit 1; }
      stamp "base built"
      python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --base-worker "$base_build/worker/ftd-worker" \
        --out "$out/ab" --impls fused,fused@base ${AB_ARGS:---shapes 4x2048 --repeat 3} 2>&1 \
        | tee "$out/ab_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    perf)
      stamp "performance table: ftd fused and its memory options, short context"
      python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --out "$out/perf" \
        --shapes 1x512,4x2048,8x2048,16x2048 --impls fused,fused+es,fused+ac=selective,fused+ac=full ${PERF_ARGS:-} 2>&1 \
        | tee "$out/perf_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    perf-long)
      stamp "performance table: long context"
      python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --out "$out/perf-long" \
        --shapes 1x8192,2x8192,1x32768 --impls fused,fused+ac=selective,fused+ac=full --steps 8 ${PERF_ARGS:-} 2>&1 \
        | tee "$out/perf_long_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    perf-peers)
      # Each peer at the largest shape that runs, with HF gradient checkpointing where it is not expected
      # to fit without it or ran out of memory (the table's impl then ends in +gc); a run past 150 s, or
      # past 420 s of peer runs in all, is stopped (TIMEOUT).
      stamp "performance table: HF peers (eager, torch.compile, Liger-Kernel), each at its largest shape"
      python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --out "$out/perf-peers" \
        --shapes 8x2048,4x2048 --impls hf,hf-compile,hf-liger --largest --steps 6 --warmup 2 --run-timeout 150 --budget-s 420 \
        ${PEERS_ARGS:-} 2>&1 | tee "$out/perf_peers_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    breakdown)
      stamp "one step's device time by category from PROFILE jobs (fused set, 4x2048 and 1x512)"
      python3 bench/profile_breakdown.py --build "$build" --out "$out/breakdown" ${BREAKDOWN_ARGS:-} 2>&1 \
        | tee "$out/breakdown.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    fp8-breakdown)
      # One step of ftd fp8, ftd fused (bf16) and HF + torchao float8 (compiled per layer), kernel by kernel,
      # on the same categories (bench/profile_breakdown.py --trace); traces gzipped under $out/fp8-breakdown.
      d=$out/fp8-breakdown; mkdir -p "$d"
      shape=${FP8_BREAKDOWN_SHAPE:-4x2048}; b=${shape%x*}; t=${shape#*x}
      for ks in ${FP8_BREAKDOWN_SETS:-fp8 fused}; do
        stamp "PROFILE job: $ks set at $shape"
        python3 bench/profile_breakdown.py --build "$build" --out "$d" --shapes "$shape" --kernel-set "$ks" \
          --trace-dir "$d" ${BREAKDOWN_ARGS:-} > "$d/breakdown-$ks.log" 2>&1 || rc=1
        grep -E "^\|" "$d/breakdown-$ks.log" | head -12
        [ -f "$d/trace-$ks-$shape.json" ] && gzip -f "$d/trace-$ks-$shape.json"
      done
      stamp "torch.profiler: HF + torchao float8 at $shape"
      python3 -c "import sys; sys.path.insert(0, 'bench'); from ftdbench import token_file; token_file('$d/tokens.u32', $b * ($t + 1) * 8)"
      timeout 400 python3 bench/hf_train.py --tokens "$d/tokens.u32" --batch "$b" --seq "$t" --steps 6 --variant float8 \
        --profile-trace "$d/trace-hf-float8-$shape.json.gz" --profile-steps 2 > "$d/hf-float8.json" 2> "$d/hf-float8.err" \
        || { rc=1; tail -5 "$d/hf-float8.err"; }
      rm -f "$d/tokens.u32"
      traces=()
      for f in "fp8:trace-fp8-$shape.json.gz" "fused:trace-fused-$shape.json.gz" "hf-float8:trace-hf-float8-$shape.json.gz"; do
        [ -f "$d/${f#*:}" ] && traces+=(--trace "ftd-${f%%:*}=$d/${f#*:}:2")
      done
      python3 bench/profile_breakdown.py "${traces[@]}" --out "$d" 2>&1 | tee "$d/trace_breakdown.log" | head -80
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    roofline)
      # The measured steps: the perf and perf-long stages' tables when they ran before in this $out,
      # else a short fused run at 1x512 and 4x2048.
      stamp "roofline: matrix FLOPs at the measured GEMM peak + optimizer bytes at the measured copy bandwidth"
      benches=()
      for f in "$out/perf/train_bench.json" "$out/perf-long/train_bench.json"; do [ -f "$f" ] && benches+=(--bench "$f"); done
      if [ ${#benches[@]} -eq 0 ]; then
        python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --out "$out/roofline" --shapes 1x512,4x2048 \
          --impls fused --steps 8 --warmup 3 > "$out/roofline_bench.log" 2>&1 || rc=1
        benches=(--bench "$out/roofline/train_bench.json")
      fi
      python3 bench/roofline.py "${benches[@]}" --out "$out/roofline.json" 2>&1 | tee "$out/roofline.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    perf-levers)
      stamp "performance levers one by one"
      python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --out "$out/perf-levers" \
        --shapes 1x512,4x2048 --impls fused,fused+fp,fused+fp+nc,fused+fp+ov,fused+fp+cg,fused+fp+ac=selective,fused+fp+ov+ac=selective \
        ${PERF_ARGS:-} 2>&1 \
        | tee "$out/perf_levers_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    fp8)
      stamp "fp8 kernel set: ftd fp8 vs ftd fused (bf16) vs HF + torchao float8"
      python3 bench/train_bench.py --worker "$build/worker/ftd-worker" --out "$out/fp8" \
        --shapes 4x2048,8x2048,2x8192 --impls fused,fp8,hf-float8 --steps 10 --warmup 3 --baseline ftd-fused \
        ${FP8_ARGS:-} 2>&1 | tee "$out/fp8_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    fp8-curve)
      stamp "fp8 kernel set: 300-step loss curve against bf16 fused, and resume"
      FTD_BUILD_DIR="$build" FTD_TEST_NO_SKIP=1 python3 -m pytest -q -s -rs -p no:cacheprovider \
        tests/python/test_gpu_fp8.py > "$out/fp8_curve.log" 2>&1 || rc=1
      grep -E "step, bf16|final loss|passed|failed|Error" "$out/fp8_curve.log" | cut -c1-3000 ;;
    lora-ac)
      stamp "LoRA 4x2048 with activation checkpointing"
      python3 bench/lora_bench.py --worker "$build/worker/ftd-worker" --out "$out/lora-ac" --shapes 4x2048 \
        --impls fused,fused+ac=selective,fused+ac=full,fused+ac=selective+fcl=16,fused+ac=selective+fcl=18,hf \
        --mem-shapes "" ${LORA_ARGS:-} 2>&1 \
        | tee "$out/lora_ac_bench.log" | grep -v "^{"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    default)
      "$build/worker/ftd-worker" run --default --format text --set steps=${DEFAULT_STEPS:-10} 2>&1 \
        | tee "$out/default-job.log" | tail -4
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    *) echo "gpu.sh: unknown stage $stage (build test kbench e2e lora data service profile ckpt pack dist dist-levers ab fp8 fp8-curve fp8-breakdown perf perf-long perf-peers perf-levers lora-ac breakdown roofline default)"; exit 2 ;;
  esac
done
stamp "done (rc $rc)"
exit $rc
