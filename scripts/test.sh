#!/usr/bin/env bash
# Installs dependencies (idempotent), builds everything and runs the test suite. README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh build RelWithDebInfo -DSLIDE_BUILD_TESTS=ON
ctest --test-dir build --output-on-failure -j2 --timeout 600
