#!/usr/bin/env bash
# /invocations latency with the echo model at one kept-alive connection: RUNS runs of SECONDS each.
# Usage: bench/invocations_latency.sh [SECONDS=5] [RUNS=3]   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5} runs=${2:-3}
build=${BUILD_DIR:-build}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$build/examples/rebound-server" serve --host 127.0.0.1 --port "$port" --model echo --store memory \
  --log-level off >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break; sleep 0.1; done
"$build/bench/rebound-invocations-load" 127.0.0.1 "$port" 1 1 '{"x": [1, 2, 3]}' >/dev/null  # warm-up
for _ in $(seq 1 "$runs"); do
  "$build/bench/rebound-invocations-load" 127.0.0.1 "$port" 1 "$seconds" '{"x": [1, 2, 3]}'
done
