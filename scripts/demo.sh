#!/usr/bin/env bash
# README's main command: installs what is missing, builds slided and slidectl, starts slided on its embedded
# defaults (loopback; free ports here so it never collides with a running daemon; its state in
# deploy/demo/out/state), submits the bundled demo job and follows it to the end, then stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
SLIDE_BUILD_TARGETS="slided slidectl" bash scripts/build.sh build
port_file=$(mktemp)
rm -f "$port_file"
build/server/slided --listen 127.0.0.1:0 --port-file "$port_file" --metrics-listen 127.0.0.1:0 \
  --state-dir deploy/demo/out/state &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true; rm -f "$port_file"' EXIT
for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
addr="127.0.0.1:$(cat "$port_file")"
echo "slided is serving on $addr"
build/client/slidectl --addr "$addr" submit deploy/demo/job.yaml --follow
