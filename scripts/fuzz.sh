#!/usr/bin/env bash
# The SubmitJob fuzz target (tests/fuzz/submit_fuzz.cc) under libFuzzer, for runs longer than CI's
# (ctest submit_fuzz_test runs it through the mutation driver). The target is compiled with clang
# -fsanitize=fuzzer and linked with the libraries of the normal GCC build (build/, FTD_BUILD_DIR),
# so coverage feedback covers the target's own code, not the libraries'. New inputs go to a
# scratch copy of the corpus; a crash leaves crash-* in the current directory.
#   scripts/fuzz.sh [libFuzzer flags...]      default: -runs=1000000
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FTD_BUILD_DIR:-$root/build}
ninja -C "$build" ftd-submit-fuzz >/dev/null
link=$(ninja -C "$build" -t commands ftd-submit-fuzz | tail -1)
libs=$(echo "$link" | sed -e 's/.*-o tests\/ftd-submit-fuzz//' -e 's/&&.*//')
out=$build/tests/ftd-submit-libfuzzer
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer -I"$root" -I"$build/proto/gen" -c "$root/tests/fuzz/submit_fuzz.cc" \
  -o "$build/tests/submit_fuzz.libfuzzer.o"
(cd "$build" && clang++ -fsanitize=fuzzer "$build/tests/submit_fuzz.libfuzzer.o" -o "$out" $libs)
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp "$root"/tests/fuzz/corpus/submit/* "$corpus"/
[ $# -gt 0 ] || set -- -runs=1000000
"$out" -print_final_stats=1 "$@" "$corpus"
