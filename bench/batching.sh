#!/usr/bin/env bash
# The effect of dynamic batching on the Iris model: /invocations at 64 concurrent connections,
# for each maximum batch size, side by side in one run. Prints one markdown table of medians.
# Usage: bench/batching.sh [SECONDS_PER_RUN=5] [RUNS=3] [BATCH_SIZES="1 2 4 8 16 32 64"]
# Environment: BUILD_DIR (default build), DELAY_MS (max queue delay, default 2), WORKERS (2),
#              CONNECTIONS (64). Run from the repository root after scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5} runs=${2:-3} sizes=${3:-"1 2 4 8 16 32 64"}
build=${BUILD_DIR:-build} delay=${DELAY_MS:-2} workers=${WORKERS:-2} conns=${CONNECTIONS:-64}
server=$build/examples/rebound-server load=$build/bench/rebound-invocations-load
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
body='[5.9, 3.0, 4.2, 1.5]'

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "Iris TorchScript model, POST /invocations, $conns connections, ${seconds}s x $runs runs (median), workers $workers, max delay ${delay} ms, $(nproc) cores"
echo
echo "| max batch | requests/s | p50 ms | p99 ms | mean batch |"
echo "|---:|---:|---:|---:|---:|"
for size in $sizes; do
  rps=() p50=() p99=()
  log=$(mktemp)
  "$server" serve --host 127.0.0.1 --port "$port" --model examples/models/iris --workers "$workers" \
    --max-batch-size "$size" --max-batch-delay-ms "$delay" --http-threads $((conns + 8)) \
    >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break; sleep 0.1; done
  "$load" 127.0.0.1 "$port" "$conns" 1 "$body" >/dev/null  # warm-up
  for _ in $(seq 1 "$runs"); do
    line=$("$load" 127.0.0.1 "$port" "$conns" "$seconds" "$body")
    rps+=("$(sed -n 's/.*rps=\([0-9.]*\).*/\1/p' <<<"$line")")
    p50+=("$(sed -n 's/.*p50_us=\([0-9.]*\).*/\1/p' <<<"$line" | awk '{printf "%.2f", $1 / 1000}')")
    p99+=("$(sed -n 's/.*p99_us=\([0-9.]*\).*/\1/p' <<<"$line" | awk '{printf "%.2f", $1 / 1000}')")
  done
  kill -TERM $pid; wait $pid || true
  mean_batch=$(sed -n 's/.*mean batch \([0-9.]*\).*/\1/p' "$log" | tail -1)
  rm -f "$log"
  printf "| %s | %s | %s | %s | %s |\n" "$size" \
    "$(printf '%s\n' "${rps[@]}" | median)" "$(printf '%s\n' "${p50[@]}" | median)" \
    "$(printf '%s\n' "${p99[@]}" | median)" "${mean_batch:-?}"
done
