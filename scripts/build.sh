#!/usr/bin/env bash
# Installs the dependencies (Debian bookworm packages) and builds rebound into ./build.
# Environment: BUILD_DIR (default build), BUILD_TYPE (default RelWithDebInfo), REBOUND_CMAKE_ARGS
# (more -D options, space-separated; CI passes -DREBOUND_WERROR=ON), BUILD_TARGETS (the targets to
# build, space-separated; default: everything, the test suite included).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build_dir=${BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
read -r -a extra <<<"${REBOUND_CMAKE_ARGS:-}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "${launcher[@]}" \
  "${extra[@]}"
read -r -a targets <<<"${BUILD_TARGETS:-}"
cmake --build "$build_dir" --parallel "$(nproc)" ${targets[@]+--target "${targets[@]}"}
