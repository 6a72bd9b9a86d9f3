#!/usr/bin/env bash
# Memory per queued job: fills rebound-server (memory store, a model that never finishes) with about
# a million jobs and compares its resident memory before and after.
# Usage: bench/queued_memory.sh [SECONDS=35]   (needs wrk; from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-35}
bin=${BUILD_DIR:-build}/examples/rebound-server
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --host 127.0.0.1 --port "$port" --model sleep:80000 --workers 1 --store memory \
  --queue-capacity 2000000 --allow-private-callbacks --log-level off >/dev/null 2>&1 &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break; sleep 0.1; done
curl -s -o /dev/null -d '{"id":"warm-up","callback_url":"http://127.0.0.1:9/x"}' "http://127.0.0.1:$port/v1/inferences"
before=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
CALLBACK_URL="http://127.0.0.1:9100/v1/results" wrk -t1 -c32 -d"${seconds}s" -s bench/submit.lua \
  "http://127.0.0.1:$port" >/dev/null
jobs=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^rebound_jobs_accepted_total/{print $2}')
after=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
echo "queued jobs: $jobs, resident before: ${before} KiB, after: ${after} KiB," \
     "per queued job: $(( (after - before) * 1024 / jobs )) bytes"
