#!/usr/bin/env bash
# The demo client's round trip against a real rebound-server: plain, signed, and with a wrong
# secret (which must fail). Usage: demo_round_trip.sh REBOUND_SERVER REBOUND_DEMO_CLIENT
set -euo pipefail
server_bin=$1 client_bin=$2
secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
# Ed25519 (v1a): RFC 8032's first test key, and its public key.
signing_key=whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=
public_key=whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=
log=$(mktemp)
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT

"$server_bin" serve --model echo --store memory --host 127.0.0.1 --port 0 --allow-private-callbacks --signing-secret "$secret" --signing-key "$signing_key" >"$log" 2>&1 &
pid=$!
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "server did not start:"; cat "$log"; exit 1; }

out=$("$client_bin" --server "http://127.0.0.1:$port" --id demo-1 --input '{"features":[1,2]}' --timeout 20)
echo "$out"
grep -q 'server answered 202' <<<"$out"
grep -q '"result":{"features":\[1,2\]}' <<<"$out"

out=$("$client_bin" --server "http://127.0.0.1:$port" --id demo-2 --signing-secret "$secret" --timeout 20)
echo "$out"
grep -q 'signature verified' <<<"$out"

# --wait and --priority: the answer is the final status (200), and the callback comes as well.
out=$("$client_bin" --server "http://127.0.0.1:$port" --id demo-7 --input '"hi"' --priority 0 --wait 10 --timeout 20)
echo "$out"
grep -q 'server answered 200 .*"priority":0.*"status":"succeeded"' <<<"$out"
grep -q 'callback received' <<<"$out"

# The server publishes the public key; the client fetches it and verifies the v1a signature.
out=$("$client_bin" --server "http://127.0.0.1:$port" --id demo-4 --server-keys --timeout 20)
echo "$out"
grep -qF "server's webhook keys: [\"$public_key\"]" <<<"$out"
grep -q 'signature verified' <<<"$out"
# ... and with the public key given by hand.
out=$("$client_bin" --server "http://127.0.0.1:$port" --id demo-5 --signing-secret "$public_key" --timeout 20)
grep -q 'signature verified' <<<"$out"

set +e
# Another key's public key does not verify: exit 3.
"$client_bin" --server "http://127.0.0.1:$port" --id demo-6 --timeout 20 \
  --signing-secret whpk_O2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik=
rc=$?
[ "$rc" -eq 3 ] || { echo "another public key must exit 3, got $rc"; exit 1; }
"$client_bin" --server "http://127.0.0.1:$port" --id demo-3 --signing-secret whsec_b3RoZXJzZWNyZXQ= --timeout 20
rc=$?
set -e
[ "$rc" -eq 3 ] || { echo "a wrong secret must exit 3, got $rc"; exit 1; }

# SIGTERM: the server stops cleanly and exits 0.
kill -TERM $pid
wait $pid
echo "demo round trip: ok"
