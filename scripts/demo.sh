#!/usr/bin/env bash
# The seed's flow end to end on a real model: installs, builds, starts rebound-server with the
# Iris classifier (TorchScript), runs rebound-demo-client (which opens a callback receiver, submits
# one flower's measurements and prints the signed prediction it is called back with), then stops
# the server.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs (the server, with the TorchScript support, and the client): the test
# suite's 70 targets, and the tools only tests use (Redis, nginx, clang, podman, node, chromium),
# are the test command's, not the demo's.
export REBOUND_SKIP_TEST_TOOLS=${REBOUND_SKIP_TEST_TOOLS:-1}
export REBOUND_SKIP_CONTAINER=${REBOUND_SKIP_CONTAINER:-1}
export REBOUND_SKIP_NODE_TOOLS=${REBOUND_SKIP_NODE_TOOLS:-1}
BUILD_TARGETS="rebound-server rebound-demo-client" ./scripts/build.sh
bin=${BUILD_DIR:-build}/examples
port=${PORT:-8080}
secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw  # a demo secret; never use a published one for real

"$bin/rebound-server" serve --host 127.0.0.1 --port "$port" --model examples/models/iris \
  --store "sqlite:${BUILD_DIR:-build}/demo-jobs.db" --allow-private-callbacks --signing-secret "$secret" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break
  sleep 0.1
done

"$bin/rebound-demo-client" --server "http://127.0.0.1:$port" \
  --input '[6.3, 3.3, 6.0, 2.5]' --signing-secret "$secret" --timeout 30
