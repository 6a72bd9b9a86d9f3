#!/usr/bin/env bash
# The example backends of docs/models.md serve what they promise.
# Usage: example_backends.sh REBOUND_CUSTOM_MODEL REBOUND_RECOMMENDED_BACKEND
set -euo pipefail
minimal=$1 recommended=$2
fail() { echo "FAIL: $*"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done' EXIT
wait_ready() { for _ in $(seq 1 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/ping")" = 200 ] && return 0; sleep 0.1; done; fail "port $1 never ready"; }

p1=$(free_port); "$minimal" "$p1" >/dev/null & pids+=($!)
wait_ready "$p1"
out=$(curl -s --data '{"text": "one two three"}' "http://127.0.0.1:$p1/invocations")
[ "$out" = '{"words":3}' ] || fail "minimal backend answered $out"

p2=$(free_port); "$recommended" "$p2" >/dev/null & pids+=($!)
wait_ready "$p2"
out=$(curl -s --data '{"text": "Great food, good service!"}' "http://127.0.0.1:$p2/invocations")
[ "$out" = '{"label":"positive","score":3}' ] || fail "recommended backend answered $out"
code=$(curl -s -o /dev/null -w '%{http_code}' --data '{"txt": 1}' "http://127.0.0.1:$p2/invocations")
[ "$code" = 422 ] || fail "recommended backend took bad input: $code"
kill -TERM "${pids[1]}"; wait "${pids[1]}" || fail "recommended backend exit status on SIGTERM"
echo "example backends: ok"
