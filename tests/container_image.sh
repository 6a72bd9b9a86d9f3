#!/usr/bin/env bash
# Builds the SageMaker image from examples/sagemaker/Dockerfile and runs it as SageMaker does
# (`docker run image serve`): /ping, /invocations on the baked-in Iris model, SIGTERM.
#
# No image registry is reachable here, so the Debian base images the Dockerfile names are made
# locally: debootstrap --variant=minbase bookworm, imported under those names. podman runs rootful
# with runc and explicit ulimits. A machine that cannot run containers fails this script, loudly:
# an image that was never built is not a passing test.
#
# Usage: tests/container_image.sh   (from anywhere; needs root, podman, runc, debootstrap, curl)
# Environment: REBOUND_IMAGE (default localhost/rebound-sagemaker:test), KEEP_IMAGE=1 keeps it;
# REBOUND_SERVER_BINARY, a rebound-server already built on this machine (Debian bookworm, the same
# packages), makes the image with it (the Dockerfile's `runtime` stage, then that binary, stripped)
# instead of compiling it again inside: CI passes the one its first stage built.
set -euo pipefail
# (A relative REBOUND_SERVER_BINARY names a file from where the script was started.)
[ -z "${REBOUND_SERVER_BINARY:-}" ] || REBOUND_SERVER_BINARY=$(realpath -m "$REBOUND_SERVER_BINARY")
cd "$(dirname "$0")/.."

fail() {
  echo "container_image: FAIL: $*" >&2
  exit 1
}
[ "$(id -u)" = 0 ] || fail "needs root (podman runs rootful here)"
for tool in podman runc debootstrap curl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/install-deps.sh installs it)"
done

image=${REBOUND_IMAGE:-localhost/rebound-sagemaker:test}
podman=(podman --runtime runc)
limits=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096)

# The base: one minbase bookworm tree, imported as both names the Dockerfile uses.
if ! "${podman[@]}" image exists docker.io/library/debian:bookworm; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  echo "container_image: debootstrap --variant=minbase bookworm"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null ||
    fail "debootstrap failed"
  tar -C "$root" -c . | "${podman[@]}" import - docker.io/library/debian:bookworm >/dev/null ||
    fail "podman import failed"
  rm -rf "$root"
  trap - EXIT
fi
"${podman[@]}" tag docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim

if [ -n "${REBOUND_SERVER_BINARY:-}" ]; then
  [ -x "$REBOUND_SERVER_BINARY" ] || fail "REBOUND_SERVER_BINARY=$REBOUND_SERVER_BINARY is not an executable"
  echo "container_image: building $image from the runtime stage and $REBOUND_SERVER_BINARY"
  "${podman[@]}" build --pull=never --network host "${limits[@]}" --target runtime \
    -f examples/sagemaker/Dockerfile -t "$image-runtime" . || fail "the runtime stage did not build"
  # The last step of the Dockerfile, with this binary in place of the one its build stage makes.
  context=$(mktemp -d)
  trap 'rm -rf "$context"; "${podman[@]}" untag "$image-runtime" >/dev/null 2>&1 || true' EXIT
  strip -o "$context/rebound-server" "$REBOUND_SERVER_BINARY" || fail "strip failed"
  chmod 755 "$context/rebound-server"  # (strip -o follows the umask; the image runs it as rebound)
  printf 'FROM %s\nCOPY rebound-server /usr/local/bin/rebound-server\n' "$image-runtime" \
    >"$context/Containerfile"
  "${podman[@]}" build --pull=never --network host "${limits[@]}" -f "$context/Containerfile" \
    -t "$image" "$context" || fail "the image did not build"
  rm -rf "$context"
  trap - EXIT
  "${podman[@]}" untag "$image-runtime" >/dev/null 2>&1 || true
else
  echo "container_image: building $image (the server compiled inside)"
  "${podman[@]}" build --pull=never --network host "${limits[@]}" \
    -f examples/sagemaker/Dockerfile -t "$image" . || fail "the image did not build"
fi

# SageMaker starts a multi-model endpoint only on an image that says it serves several models.
label=$("${podman[@]}" image inspect -f \
  '{{index .Labels "com.amazonaws.sagemaker.capabilities.multi-models"}}' "$image")
[ "$label" = true ] || fail "the image lacks com.amazonaws.sagemaker.capabilities.multi-models=true ('$label')"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
name=rebound-image-test-$$
cleanup() {
  "${podman[@]}" rm -f "$name" >/dev/null 2>&1 || true
  [ "${KEEP_IMAGE:-0}" = 1 ] || "${podman[@]}" rmi -f "$image" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# As SageMaker starts it: the image, then `serve`; it listens on 8080 inside.
"${podman[@]}" run -d --name "$name" --network host -e SAGEMAKER_BIND_TO_PORT="$port" \
  "${limits[@]}" "$image" serve >/dev/null || fail "the container did not start"

ready=
for _ in $(seq 1 300); do
  if [ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$port/ping")" = 200 ]; then
    ready=1
    break
  fi
  [ "$("${podman[@]}" inspect -f '{{.State.Running}}' "$name")" = true ] || break
  sleep 0.2
done
[ -n "$ready" ] || { "${podman[@]}" logs "$name" >&2; fail "/ping never answered 200"; }

answer=$(curl -s -m 10 -H 'Content-Type: application/json' -d '[6.3, 3.3, 6.0, 2.5]' \
  "http://127.0.0.1:$port/invocations")
echo "$answer" | grep -q '"label":"virginica"' || { "${podman[@]}" logs "$name" >&2; fail "/invocations answered: $answer"; }
answer=$(curl -s -m 10 -H 'Content-Type: application/json' -d '{"id":"image-1","input":[5.1,3.5,1.4,0.2]}' \
  "http://127.0.0.1:$port/v1/inferences")
echo "$answer" | grep -q '"message":"Received"' || fail "POST /v1/inferences answered: $answer"

start=$(date +%s)
"${podman[@]}" stop -t 30 "$name" >/dev/null
status=$("${podman[@]}" inspect -f '{{.State.ExitCode}}' "$name")
took=$(($(date +%s) - start))
"${podman[@]}" logs "$name" 2>&1 | tail -n 5
[ "$status" = 0 ] || fail "exit status $status after SIGTERM"
[ "$took" -lt 30 ] || fail "SIGTERM took $took s"
echo "container_image: ok (built, /ping, /invocations, SIGTERM exit 0 in ${took}s)"
