#!/usr/bin/env bash
# The SageMaker container contract, against the real binary as SageMaker starts it:
# `rebound-server serve` with no flags, SM_MODEL_DIR and SAGEMAKER_BIND_TO_PORT from the
# environment; GET /ping, POST /invocations, SIGTERM handled well inside 30 s.
# Usage: sagemaker_contract.sh REBOUND_SERVER MODEL_DIR
set -euo pipefail
server_bin=$(realpath "$1") model_dir=$(realpath "$2")
fail() { echo "FAIL: $*"; cat "$log"; exit 1; }
log=$(mktemp)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
workdir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$log" "$workdir"' EXIT
cd "$workdir"  # the default store, sqlite:rebound.db, is created in the working directory

SM_MODEL_DIR=$model_dir SAGEMAKER_BIND_TO_PORT=$port "$server_bin" serve >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "listening on 0.0.0.0:$port" "$log" && break; sleep 0.1; done
grep -q "listening on 0.0.0.0:$port" "$log" || fail "did not listen on 0.0.0.0:$port"
grep -q "model iris" "$log" || fail "did not load the model from SM_MODEL_DIR"

out=$(curl -s -m 2 -D - "http://127.0.0.1:$port/ping")
grep -q "^HTTP/1.1 200" <<<"$out" || fail "/ping: $out"
grep -qi "^Content-Length: 0" <<<"$out" || fail "/ping body not empty: $out"

out=$(curl -s -m 5 -D - -H 'Content-Type: application/json' \
  -H 'X-Amzn-SageMaker-Custom-Attributes: c000b4f9-df62-4c85-a0bf-7c525f9104a4' \
  --data '[6.3, 3.3, 6.0, 2.5]' "http://127.0.0.1:$port/invocations")
grep -q "^HTTP/1.1 200" <<<"$out" || fail "/invocations: $out"
grep -qi "^X-Amzn-SageMaker-Custom-Attributes: c000b4f9-df62-4c85-a0bf-7c525f9104a4" <<<"$out" || fail "attributes not echoed: $out"
grep -qi "^Content-Length: [0-9]" <<<"$out" || fail "no Content-Length: $out"
grep -q '"label":"virginica"' <<<"$out" || fail "wrong prediction: $out"

code=$(curl -s -o /dev/null -w '%{http_code}' --data '[1, 2]' "http://127.0.0.1:$port/invocations")
[ "$code" = 422 ] || fail "bad input answered $code"

# SIGTERM with requests in flight: the server exits 0, well inside SageMaker's 30 s.
for i in $(seq 1 20); do
  curl -s -o /dev/null -m 10 --data '[5.1, 3.5, 1.4, 0.2]' "http://127.0.0.1:$port/invocations" &
done
start=$(date +%s%N)
kill -TERM $pid
wait $pid || fail "exit status $? after SIGTERM"
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "stopped ${elapsed_ms} ms after SIGTERM"
[ "$elapsed_ms" -lt 30000 ] || fail "took ${elapsed_ms} ms to stop"
wait
echo "sagemaker contract: ok"
