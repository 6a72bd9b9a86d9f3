#!/usr/bin/env bash
# The seed's flow end to end: installs, builds, starts rebound-server, runs rebound-demo-client
# (which opens a callback receiver, submits one job and prints the result it is called back with),
# then stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
bin=${BUILD_DIR:-build}/examples
port=${PORT:-8080}
secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw  # a demo secret; never use a published one for real

"$bin/rebound-server" serve --host 127.0.0.1 --port "$port" --model echo \
  --allow-private-callbacks --signing-secret "$secret" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break
  sleep 0.1
done

"$bin/rebound-demo-client" --server "http://127.0.0.1:$port" \
  --input '{"text": "hello from the demo"}' --signing-secret "$secret" --timeout 30
