#!/usr/bin/env bash
# rebound-server's command line: --help lists every option with its default, bad values exit
# non-zero with a message, and the flags take effect (API key, SAGEMAKER_BIND_TO_PORT, allowlist).
# Usage: server_cli.sh REBOUND_SERVER
set -euo pipefail
server_bin=$1
fail() { echo "FAIL: $*"; exit 1; }

help=$("$server_bin" --help)
for opt in --host --port --model --store --workers --queue-capacity --http-threads --api-key \
           --signing-secret --signing-key --callback-timeout --max-tries --backoff --backoff-base --backoff-factor \
           --backoff-cap --jitter --max-elapsed --retry-after-cap --allow-private-callbacks \
           --callback-allow --callback-connections --callback-ca-file --retention --memory-store-mib --job-ttl \
           --log-level --inference-timeout --lease --server-id --tenant --tenant-rate --tenant-burst serve; do
  grep -q -- "$opt" <<<"$help" || fail "--help does not list $opt"
done
grep -q -- '--max-tries INT:INT in \[1 - 1000\]=5' <<<"$help" || fail "--help does not show the --max-tries default"
grep -q -- '--backoff TEXT:{constant,decorrelated,exponential,fibonacci}=exponential' <<<"$help" || fail "--backoff default"

expect_refusal() {  # expect_refusal "message part" args...
  local want=$1; shift
  set +e
  out=$("$server_bin" "$@" 2>&1)
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || fail "'$*' was accepted"
  grep -qi -- "$want" <<<"$out" || fail "'$*' said: $out"
}
expect_refusal "not in range" --workers 0
# Read whole, then matched: the server exits non-zero here, and under pipefail a pipe into grep
# would count that as no match.
redis_answer=$("$server_bin" --store redis://127.0.0.1:1 --model echo 2>&1 || true)
if grep -q "no Redis support" <<<"$redis_answer"; then
  echo "this build has no Redis store: its command line is not checked"
else
  expect_refusal "REBOUND_REDIS_PASSWORD" --store redis://user:secret@127.0.0.1:6379 --model echo
  expect_refusal "bad port" --store redis://127.0.0.1:99999 --model echo
  # Nothing listens on port 1: refused at start with the reason, not at the first submission.
  expect_refusal "cannot use the redis job store" --store redis://127.0.0.1:1 --model echo
fi
expect_refusal "not in range" --lease 0
SM_MODEL_DIR=/nonexistent/model expect_refusal "/nonexistent/model" serve
expect_refusal "not in" --backoff wobbly
expect_refusal "not in" --jitter sometimes
expect_refusal "not in" --log-level verbose
expect_refusal "whsec_" --signing-secret not-a-secret
expect_refusal "whsk_" --signing-key whsk_c2VjcmV0
expect_refusal "whsk_" --signing-key whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
expect_refusal "allowlist" --callback-allow 10.0.0.0/99
expect_refusal "resnet" --model resnet
expect_refusal "unsupported store" --store mysql://db
# A PostgreSQL that cannot be reached: a clear refusal at start (the password never printed).
# (A build without libpq says it has no PostgreSQL support instead.)
expect_refusal 'cannot connect\|no PostgreSQL support' --store 'postgresql://u:secret@127.0.0.1:1/db'
grep -q secret <<<"$out" && fail "the store's password was printed: $out"
expect_refusal "cannot open the job store" --store sqlite:/nonexistent/dir/jobs.db
expect_refusal "not in range" --port 70000
expect_refusal "not in range" --memory-store-mib 0
expect_refusal "callback-timeout" --callback-timeout soon
expect_refusal "not expected" --no-such-flag
# A tenant's turns and rate: each setting checked, and only for a tenant that has a key.
expect_refusal "no --api-key" --model echo --tenant acme:rate=5
expect_refusal "weight must be from 1 to 1000" --model echo --api-key acme:k1 --api-key b:k2 --tenant acme:weight=0
expect_refusal "rate must be a number" --model echo --api-key acme:k1 --api-key b:k2 --tenant acme:rate=fast
expect_refusal "unknown setting" --model echo --api-key acme:k1 --api-key b:k2 --tenant acme:speed=1
expect_refusal "given twice" --model echo --api-key acme:k1 --api-key b:k2 --tenant acme:rate=1,rate=2
expect_refusal "twice" --model echo --api-key acme:k1 --api-key b:k2 --tenant acme:rate=1 --tenant acme:weight=2
expect_refusal "not in range" --model echo --tenant-rate -1
expect_refusal "burst must be 0" --model echo --api-key acme:k1 --api-key b:k2 --tenant acme:burst=0.5
# Authentication or signing cannot be turned off by an empty value.
expect_refusal "must not be empty" --api-key ""
expect_refusal "must not be empty" --api-key " "
for var in REBOUND_API_KEY REBOUND_SIGNING_SECRET REBOUND_SIGNING_KEY; do
  set +e
  out=$(env "$var=" timeout 20 "$server_bin" --model echo --store memory --port 0 2>&1)
  rc=$?
  set -e
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "$var= was accepted (exit $rc)"
  grep -q "$var is set but empty" <<<"$out" || fail "$var= said: $out"
done

log=$(mktemp)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -f "$log"; }
trap cleanup EXIT
wait_port() {
  for _ in $(seq 1 100); do
    port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$log")
    [ -n "$port" ] && return 0
    sleep 0.1
  done
  cat "$log"; fail "server did not start"
}

# SAGEMAKER_BIND_TO_PORT picks the port; --api-key guards the API but not /ping.
free_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
SAGEMAKER_BIND_TO_PORT=$free_port REBOUND_SIGNING_KEY=whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A= \
  "$server_bin" serve --model echo --store memory --host 127.0.0.1 --api-key s3cret >"$log" 2>&1 &
pids+=($!)
wait_port
[ "$port" = "$free_port" ] || fail "SAGEMAKER_BIND_TO_PORT ignored: $port"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/ping")" = 200 ] || fail "/ping"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d '{"id":"a"}' "http://127.0.0.1:$port/v1/inferences")
[ "$code" = 401 ] || fail "no key: $code"
# The public keys are public: a receiver reads them without the API key (REBOUND_SIGNING_KEY).
keys=$(curl -s "http://127.0.0.1:$port/v1/webhook-keys")
[ "$keys" = '{"keys":["whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="]}' ] || fail "webhook keys: $keys"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer s3cret' -H 'Content-Type: application/json' -X POST -d '{"id":"a"}' "http://127.0.0.1:$port/v1/inferences")
[ "$code" = 202 ] || fail "with key: $code"
# Without --allow-private-callbacks a loopback callback is refused; --callback-allow lets one in.
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer s3cret' -H 'Content-Type: application/json' -X POST \
  -d '{"id":"b","callback_url":"http://127.0.0.1:9/x"}' "http://127.0.0.1:$port/v1/inferences")
[ "$code" = 422 ] || fail "loopback callback: $code"
kill -TERM "${pids[0]}"; wait "${pids[0]}" || fail "SIGTERM exit status"

: >"$log"
"$server_bin" --model echo --store memory --host 127.0.0.1 --port 0 --callback-allow 127.0.0.0/8 >"$log" 2>&1 &
pids+=($!)
wait_port
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -X POST \
  -d '{"id":"b","callback_url":"http://127.0.0.1:9/x"}' "http://127.0.0.1:$port/v1/inferences")
[ "$code" = 202 ] || fail "allowlisted callback: $code"

# --tenant NAME:rate=R,burst=B holds that tenant (the one tenant here) to its rate.
: >"$log"
"$server_bin" --model echo --store memory --host 127.0.0.1 --port 0 --api-key acme:k1 \
  --tenant acme:rate=0.01,burst=2 >"$log" 2>&1 &
pids+=($!)
wait_port
codes=""
for id in r1 r2 r3; do
  codes+=$(curl -s -o /dev/null -w '%{http_code} ' -H 'Authorization: Bearer k1' -H 'Content-Type: application/json' \
    -X POST -d "{\"id\":\"$id\"}" "http://127.0.0.1:$port/v1/inferences")
done
[ "$codes" = "202 202 429 " ] || fail "--tenant rate: $codes"

# A drain that leaves work exits 1, and says what becomes of it for the store it ran on.
drained() {  # drained STORE "message part"
  : >"$log"
  "$server_bin" --model sleep:60 --store "$1" --host 127.0.0.1 --port 0 >"$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  wait_port
  curl -s -o /dev/null -H 'Content-Type: application/json' -X POST -d '{"id":"slow"}' \
    "http://127.0.0.1:$port/v1/inferences"
  sleep 0.3
  kill -TERM "$pid"; sleep 0.3; kill -TERM "$pid"  # the second signal ends the drain at once
  set +e; wait "$pid"; local rc=$?; set -e
  [ "$rc" = 1 ] || { cat "$log"; fail "a drain that left work with $1 exited $rc"; }
  grep -q -- "$2" "$log" || { cat "$log"; fail "the drain's words with $1"; }
}
drained memory "are lost"

# A server that dies says why on its log: the signal, and a backtrace. (Under a sanitizer its own
# handler reports fatal signals instead: not checked there.)
if ! ldd "$server_bin" | grep -Eq 'lib(asan|tsan)'; then
  : >"$log"
  "$server_bin" --model echo --store memory --host 127.0.0.1 --port 0 >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_port
  kill -SEGV "$pid"
  set +e; wait "$pid"; rc=$?; set -e
  [ "$rc" = 139 ] || { cat "$log"; fail "SIGSEGV exit status $rc"; }
  grep -q "fatal signal SIGSEGV" "$log" || { cat "$log"; fail "a fatal signal was not reported"; }
  grep -q "rebound-server(" "$log" || { cat "$log"; fail "no backtrace after the fatal signal"; }
fi
drained "sqlite:$(mktemp -d)/jobs.db" "stay in the store"
echo "server command line: ok"
