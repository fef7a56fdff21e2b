#!/usr/bin/env bash
# ASan + UBSan: builds ftd, ftctl, ftd-fake-worker and the server's and client's unit tests with
# -fsanitize=address,undefined in build-asan/ (FTD_ASAN_BUILD_DIR), then runs those unit tests and
# the service test suites (test_service.py, test_auth.py, test_limits.py) against it. LibTorch is not
# sanitized: the worker is the normal build's (build/, FTD_BUILD_DIR), linked into build-asan/.
# Any sanitizer report fails the run: errors abort the process that hit them, and every report is
# also written under build-asan/sanitizer-reports/, which must stay empty.
# Not part of scripts/test.sh: it is a second build of the daemon and client, and the service suites
# run slower under the sanitizers. Run it after changes to the daemon's threading or memory handling.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
asan=${FTD_ASAN_BUILD_DIR:-$root/build-asan}
normal=${FTD_BUILD_DIR:-$root/build}
py=$root/.venv/bin/python
if [ ! -f "$asan/CMakeCache.txt" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Warnings are the normal build's business: under the sanitizers GCC reports false
  # maybe-uninitialized ones inside libstdc++ (<regex>), so they are not errors here.
  cmake -S . -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFTD_SANITIZE=address,undefined -DFTD_WERROR=OFF \
    -DFTD_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    -DPython3_EXECUTABLE="$py" "${launcher[@]}" >/dev/null
fi
ninja -C "$asan" -j"${FTD_JOBS:-2}" server/all client/all
[ -x "$normal/worker/ftd-worker" ] || ninja -C "$normal" -j"${FTD_JOBS:-2}" ftd-worker
mkdir -p "$asan/worker"
ln -sfn "$normal/worker/ftd-worker" "$asan/worker/ftd-worker"

reports=$asan/sanitizer-reports
rm -rf "$reports" && mkdir -p "$reports"
# protect_shadow_gap=0: the CUDA runtime, which ftd links, maps memory where ASan's gap would be.
export ASAN_OPTIONS="log_path=$reports/asan:abort_on_error=1:detect_leaks=1:protect_shadow_gap=0:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1:halt_on_error=1"
# Third-party leaks only, each justified in the file.
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
# The sanitized daemon and client run several times slower: tests scale the windows they wait in
# (tests/python/ftdservice.py), never their assertions.
export FTD_TEST_TIME_FACTOR=${FTD_TEST_TIME_FACTOR:-4}
status=0
ctest --test-dir "$asan/server" --output-on-failure -j"${FTD_JOBS:-2}" || status=1
ctest --test-dir "$asan/client" --output-on-failure -j"${FTD_JOBS:-2}" || status=1
FTD_BUILD_DIR=$asan "$py" -m pytest -q -p no:cacheprovider tests/python/test_service.py tests/python/test_auth.py \
  tests/python/test_limits.py || status=1
if [ -n "$(ls -A "$reports")" ]; then
  echo "sanitizer reports (in $reports):"
  for f in "$reports"/*; do echo "== $f"; head -40 "$f"; done
  status=1
fi
[ $status -eq 0 ] && echo "sanitize.sh: ASan+UBSan build, unit tests and service suites passed with no report"
exit $status
