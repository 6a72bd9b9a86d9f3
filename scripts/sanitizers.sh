#!/usr/bin/env bash
# The core's test suite under AddressSanitizer + UndefinedBehaviorSanitizer and under
# ThreadSanitizer, then the libFuzzer targets for a bounded time each. libtorch stays out
# (REBOUND_WITH_TORCH=OFF): its prebuilt libraries are not instrumented.
# Usage: scripts/sanitizers.sh [FUZZ_SECONDS=30]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
fuzz_seconds=${1:-30}
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
common=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DREBOUND_WITH_TORCH=OFF -DREBOUND_BUILD_BENCH=OFF
        "${launcher[@]}")
# The consumer project links the installed library without sanitizers; the kill -9 test runs in
# the main suite.
skip="cmake_consumer|crash_recovery|noisy_neighbours|memory_budget|bare_server"  # load tests: timed, and RSS-bounded

echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan "${common[@]}" \
  "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
cmake --build build-asan --parallel "$(nproc)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --parallel "$(nproc)" --timeout 600 -E "$skip")

echo "== ThreadSanitizer"
cmake -S . -B build-tsan "${common[@]}" "-DCMAKE_CXX_FLAGS=-fsanitize=thread -O1 -g" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread"
cmake --build build-tsan --parallel "$(nproc)"
# redis_fleet's Redis restart under TSan's tenfold slowdown: in 3 of 4 runs of 2026-11-28 a few
# hundred accepted jobs were not called back within its 80 s bound (no race reported; without TSan
# it passes). It stays in the main suite and under ASan; the closing note of that day tracks it.
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 suppressions=$root/tests/tsan.supp" ctest --output-on-failure --parallel "$(nproc)" --timeout 600 -E "$skip|redis_fleet")

echo "== libFuzzer (${fuzz_seconds}s per target)"
CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DREBOUND_BUILD_FUZZERS=ON -DREBOUND_BUILD_TESTS=OFF \
  -DREBOUND_BUILD_EXAMPLES=OFF -DREBOUND_BUILD_BENCH=OFF -DREBOUND_WITH_TORCH=OFF -DREBOUND_INSTALL=OFF
cmake --build build-fuzz --parallel "$(nproc)" --target fuzz_submission fuzz_callback_url fuzz_retry_after fuzz_http
for target in submission callback_url retry_after http; do
  corpus=$(mktemp -d)
  cp tests/fuzz/corpus/$target/* "$corpus/"
  build-fuzz/tests/fuzz/fuzz_$target -max_total_time="$fuzz_seconds" -print_final_stats=1 "$corpus" \
    2>&1 | grep -E "^(Done|stat::number_of_executed_units)|ERROR|runtime error|SUMMARY" || true
  status=${PIPESTATUS[0]}
  rm -rf "$corpus"
  [ "$status" -eq 0 ] || { echo "fuzz_$target found a failure"; exit 1; }
done
echo "sanitizers and fuzzers: ok"
