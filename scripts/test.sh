#!/usr/bin/env bash
# The whole test suite on a fresh Debian bookworm machine: installs, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --parallel "$(nproc)" --timeout 300
