#!/usr/bin/env bash
# Profiles rebound-server under the end-to-end load of bench/run.py (wrk submitting echo jobs over
# 32 connections, an nginx receiver answering the callbacks) with perf, and prints where its CPU
# time goes: by shared object, then by symbol.
# Usage: bench/profile.sh [memory|sqlite] [SECONDS=10]   (from the repository root, after
# scripts/build.sh; needs linux-perf, wrk and nginx-light; perf.data is kept in $OUT or a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
store=${1:-memory} seconds=${2:-10}
case $store in memory) store_arg=memory ;; sqlite) store_arg=sqlite:jobs.db ;; *) echo "store: memory or sqlite" >&2; exit 2 ;; esac
bin=$(pwd)/${BUILD_DIR:-build}/examples/rebound-server
out=${OUT:-$(mktemp -d -t rebound-profile.XXXX)}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port) rport=$(free_port)
mkdir -p "$out/body"
sed -e "s#RUNDIR#$out#g" -e "s#RPORT#$rport#g" bench/receiver.nginx.conf >"$out/nginx.conf"
nginx -c "$out/nginx.conf" -p "$out" & ngx=$!
(cd "$out" && exec "$bin" serve --host 127.0.0.1 --port "$port" --model echo --store "$store_arg" \
  --allow-private-callbacks --log-level warn) >"$out/server.log" 2>&1 &
srv=$!
trap 'kill $srv $ngx 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break; sleep 0.1; done
CALLBACK_URL="http://127.0.0.1:$rport/v1/results" wrk -t1 -c32 -d"$((seconds + 2))s" --latency \
  -s bench/submit.lua "http://127.0.0.1:$port" >"$out/wrk.txt" &
wrk_pid=$!
sleep 1
perf record -q -F 1999 -g --call-graph dwarf,32768 -p "$srv" -o "$out/perf.data" -- sleep "$seconds" \
  2>/dev/null
wait $wrk_pid
grep -E 'Requests/sec|99%' "$out/wrk.txt"
echo "== by shared object"
perf report -i "$out/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -15
echo "== by symbol (self time)"
perf report -i "$out/perf.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null |
  grep -v '^#' | grep -v '^$' | head -50
echo "perf.data in $out (perf report -i $out/perf.data)"
