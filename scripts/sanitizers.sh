#!/usr/bin/env bash
# The core's test suite under AddressSanitizer + UndefinedBehaviorSanitizer and under
# ThreadSanitizer, then the libFuzzer targets for a bounded time each. libtorch stays out
# (REBOUND_WITH_TORCH=OFF): its prebuilt libraries are not instrumented.
# Both builds carry line tables only (-g1): a report still names each frame's file and line, and
# the ASan+UBSan build took 11.5 minutes here instead of 15 with full debug information (-g).
# Usage: scripts/sanitizers.sh [FUZZ_SECONDS=30]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
fuzz_seconds=${1:-30}
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
common=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DREBOUND_WITH_TORCH=OFF
        -DREBOUND_BUILD_BENCH=OFF
        "${launcher[@]}")
# The kill -9 test runs in the main suite; the load tests are timed and RSS-bounded; PostgreSQL's
# fleet and bloat cases are processes under load that the store's own suites (which do run here)
# cover for a sanitizer: they run in the main suite.
skip="crash_recovery|noisy_neighbours|memory_budget|bare_server|postgres_bloat|postgres_fleet"

# The ASan build is also the core's without libtorch, as a shared library, with warnings as errors:
# the core must build and pass its tests without libtorch, and the installed shared library must
# serve a consumer (cmake_consumer_find_package, built with the same flags). One build for both
# keeps CI inside its time.
echo "== AddressSanitizer + UndefinedBehaviorSanitizer (core without libtorch, shared)"
cmake -S . -B build-asan "${common[@]}" -DBUILD_SHARED_LIBS=ON -DREBOUND_WERROR=ON \
  "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
cmake --build build-asan --parallel "$(nproc)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --parallel "$(nproc)" --timeout 600 -E "$skip")

echo "== ThreadSanitizer"
cmake -S . -B build-tsan "${common[@]}" "-DCMAKE_CXX_FLAGS=-fsanitize=thread -O1" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread"
cmake --build build-tsan --parallel "$(nproc)"
# redis_fleet's Redis restart under TSan's tenfold slowdown: in 3 of 4 runs of 2026-11-28 a few
# hundred accepted jobs were not called back within its 80 s bound (no race reported; without TSan
# it passes). It stays in the main suite and under ASan; the closing note of that day tracks it.
# Checks of documents and static files, and the browser's and the TypeScript client's runs, find
# no race that the rest does not: they run in the main suite and under ASan.
static="http_api_docs|docs_|readme_lists|cmake_no_torch|openapi_is_valid|console_browser|typescript_client"
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 suppressions=$root/tests/tsan.supp" ctest --output-on-failure --parallel "$(nproc)" --timeout 600 -E "$skip|redis_fleet|cmake_consumer|$static")

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
