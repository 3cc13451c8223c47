#!/usr/bin/env bash
# Installs dependencies (idempotent), builds everything and runs the test suite. README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DSLIDE_BUILD_TESTS=ON
cmake --build build
ctest --test-dir build --output-on-failure -j2 --timeout 600
