#!/usr/bin/env bash
# Installs everything rebound needs to build and test, from Debian bookworm's own packages.
# Safe to run again: apt-get skips what is already installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libcpp-httplib-dev nlohmann-json3-dev libboost-dev libssl-dev libcli11-dev doctest-dev
  libsqlite3-dev libjemalloc-dev libcurl4-openssl-dev
  libhiredis-dev libpq-dev
  curl python3
)
# What only the tests run: a real Redis, a real PostgreSQL and PgBouncer, nginx (the container's front), clang's sanitizers, the
# receivers' signature checks in Python, the Python client's test (httpx, a venv to install it
# into, FastAPI and uvicorn for its receiver). REBOUND_SKIP_TEST_TOOLS=1 (the demo's) leaves them out.
if [ "${REBOUND_SKIP_TEST_TOOLS:-0}" != 1 ]; then
  packages+=(redis-server postgresql pgbouncer clang-14 libclang-rt-14-dev nginx-light python3-cryptography
             python3-httpx python3-venv python3-setuptools python3-wheel python3-fastapi
             python3-uvicorn)
fi
# The container image test (tests/container_image.sh) builds and runs the SageMaker image:
# podman (rootful, runc) with a base image made by debootstrap. REBOUND_SKIP_CONTAINER=1 leaves
# them out.
if [ "${REBOUND_SKIP_CONTAINER:-0}" != 1 ]; then
  packages+=(podman runc debootstrap)
fi
# libtorch-dev is for rebound::torch (TorchScriptModel); the core builds without it, and
# REBOUND_SKIP_TORCH=1 leaves it out. Retraining the Iris model needs python3-torch and
# python3-sklearn too, which the build does not.
if [ "${REBOUND_SKIP_TORCH:-0}" != 1 ]; then
  packages+=(libtorch-dev)
fi

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo --preserve-env=DEBIAN_FRONTEND,REBOUND_SKIP_TEST_TOOLS,REBOUND_SKIP_CONTAINER,REBOUND_SKIP_TORCH,REBOUND_SKIP_NODE_TOOLS,REBOUND_NODE_TOOLS,http_proxy,https_proxy,no_proxy \
      "$0" "$@"
  fi
  echo "install-deps.sh: run as root or install sudo" >&2
  exit 1
fi

# node and npm run the OpenAPI validator (below) and the Node snippet of docs/delivery.md; Debian's
# packages unless a node is already installed. Debian's chromium is the browser that
# tests/console/console_test.mjs drives (headless, through puppeteer-core, which downloads none).
# REBOUND_SKIP_NODE_TOOLS=1 leaves them out (no npm registry needed; the OpenAPI validity and
# console tests are then not registered).
if [ "${REBOUND_SKIP_NODE_TOOLS:-0}" != 1 ]; then
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    packages+=(nodejs npm)
  fi
  packages+=(chromium)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps.sh: all packages present"
else
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The OpenAPI 3 validator for tests/openapi_valid.py and puppeteer-core for
# tests/console/console_test.mjs, from npm at the versions locked in
# scripts/node-tools, installed outside the source tree (REBOUND_NODE_TOOLS, default
# /opt/rebound-node-tools; the tests look there).
if [ "${REBOUND_SKIP_NODE_TOOLS:-0}" != 1 ]; then
  tools=${REBOUND_NODE_TOOLS:-/opt/rebound-node-tools}
  here=$(cd "$(dirname "$0")" && pwd)
  if ! cmp -s "$here/node-tools/package-lock.json" "$tools/package-lock.json" ||
     [ ! -x "$tools/node_modules/.bin/validate-api" ]; then
    mkdir -p "$tools"
    cp "$here/node-tools/package.json" "$here/node-tools/package-lock.json" "$tools/"
    (cd "$tools" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
