#!/usr/bin/env bash
# README's main command: installs what is missing, builds slided and slidectl, starts slided on its embedded
# defaults (its owner-only socket in its state directory, deploy/demo/out/state; metrics on a free port so it never
# collides with a running daemon), submits the bundled demo job and follows it to the end, then stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
SLIDE_BUILD_TARGETS="slided slidectl" bash scripts/build.sh build
state="$(pwd)/deploy/demo/out/state"
build/server/slided --state-dir "$state" --metrics-listen 127.0.0.1:0 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$state/slided.sock" ] && break; sleep 0.1; done
addr="unix:$state/slided.sock"
echo "slided is serving on $addr"
build/client/slidectl --addr "$addr" submit deploy/demo/job.yaml --follow
