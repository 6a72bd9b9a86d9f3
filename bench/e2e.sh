#!/usr/bin/env bash
# End to end, side by side in one run: the seed's FastAPI server (shared client, the peer) and
# rebound-server with the memory and the SQLite store. wrk submits jobs for DURATION seconds over
# CONNS connections; an nginx receiver counts the callbacks; each row waits (up to 120 s) for every
# accepted job's callback. Prints a markdown table of medians over RUNS runs.
# Usage: bench/e2e.sh [DURATION=10] [CONNS=32] [RUNS=3]     (from the repository root, after
# scripts/build.sh; needs: apt-get install wrk nginx-light python3-fastapi python3-uvicorn
# python3-httpx python3-backoff python3-uvloop python3-httptools)
set -u
cd "$(dirname "$0")/.."
DUR=${1:-10} CONNS=${2:-32} RUNS=${3:-3}
BIN=${BUILD_DIR:-build}/examples/rebound-server
PEER_DIR=${PEER_DIR:-../shared/peers/fastapi_seed}
HERE=$(pwd)/bench

one_run() {  # NAME PORT -- COMMAND...: prints "rps p50 p99 accepted delivered e2e rss"
  local name=$1 port=$2; shift 3
  local run rport=${RPORT:-9100}
  run=$(mktemp -d -t e2e.XXXX)
  mkdir -p "$run/body"
  sed -e "s#RUNDIR#$run#g" -e "s#RPORT#$rport#g" "$HERE/receiver.nginx.conf" >"$run/nginx.conf"
  nginx -c "$run/nginx.conf" -p "$run" & local ngx=$!
  (cd "$run" && exec "$@") >"$run/server.log" 2>&1 & local srv=$!
  for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
  sleep 0.5
  CALLBACK_URL="http://127.0.0.1:$rport/v1/results" wrk -t1 -c"$CONNS" -d"${DUR}s" --latency \
    -s "$HERE/submit.lua" "http://127.0.0.1:$port" >"$run/wrk.txt" 2>&1
  local t0 t1 acc non2xx ok del=0
  t0=$(date +%s.%N)
  acc=$(awk '/requests in/{print $1}' "$run/wrk.txt")
  non2xx=$(awk '/Non-2xx/{print $NF}' "$run/wrk.txt"); non2xx=${non2xx:-0}
  ok=$((acc - non2xx))
  for _ in $(seq 1 1200); do
    del=$(grep -c '^POST /v1/results 200' "$run/callbacks.log" 2>/dev/null || echo 0)
    [ "$del" -ge "$ok" ] && break; sleep 0.1
  done
  t1=$(date +%s.%N)
  local rss
  rss=$(awk '/VmHWM/{print $2}' /proc/$srv/status 2>/dev/null); rss=${rss:-0}
  local rps p50 p99
  rps=$(awk '/Requests\/sec/{print $2}' "$run/wrk.txt")
  p50=$(awk '/ 50%/{print $2}' "$run/wrk.txt"); p99=$(awk '/ 99%/{print $2}' "$run/wrk.txt")
  local e2e
  e2e=$(echo "scale=1; $del / ($DUR + $t1 - $t0)" | bc)
  kill $srv 2>/dev/null; wait $srv 2>/dev/null
  kill $ngx 2>/dev/null; wait $ngx 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "kept $run" >&2; else rm -rf "$run"; fi
  echo "$rps $p50 $p99 $ok $del $e2e $rss"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

row() {  # NAME PORT -- COMMAND...
  local name=$1 port=$2; shift 2
  local lines=() i
  for i in $(seq 1 "$RUNS"); do lines+=("$(one_run "$name" "$port" "$@")"); done
  col() { printf '%s\n' "${lines[@]}" | awk -v c="$1" '{print $c}' | median; }
  local lost=0 l
  for l in "${lines[@]}"; do set -- $l; [ "$5" -lt "$4" ] && lost=$((lost + $4 - $5)); done
  printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n" "$name" "$(col 6)" "$(col 1)" "$(col 2)" \
    "$(col 3)" "$(col 4)" "$lost" "$(col 7)"
}

echo "End to end (accept to callback received), echo model, $CONNS connections, ${DUR}s, median of $RUNS runs, $(nproc) cores"
echo
echo "| server | e2e jobs/s | accepted req/s | accept p50 | accept p99 | accepted per run | lost (all runs) | peak RSS KiB |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
[ -n "${ONLY_SQLITE:-}" ] || row "fastapi-seed (shared client)" 8000 -- env PEER_SLEEP_S=0 /usr/bin/python3 -m uvicorn \
  --app-dir "$(cd "$PEER_DIR" && pwd)" main_tuned:app --port 8000 --log-level warning
[ -n "${ONLY_SQLITE:-}" ] || row "rebound, memory store" 8080 -- "$(pwd)/$BIN" serve --host 127.0.0.1 --port 8080 --model echo \
  --store memory --allow-private-callbacks --log-level warn --queue-capacity 1000000
# A relative path: each run's server starts in its own fresh folder, so each run has a new store.
row "rebound, SQLite store" 8080 -- "$(pwd)/$BIN" serve --host 127.0.0.1 --port 8080 --model echo \
  --store sqlite:jobs.db --allow-private-callbacks --log-level warn --queue-capacity 1000000
