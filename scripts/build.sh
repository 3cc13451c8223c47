#!/usr/bin/env bash
# Configures and builds the project: scripts/build.sh [BUILD_DIR=build] [BUILD_TYPE=RelWithDebInfo] [cmake args...]
# The one build recipe: scripts/test.sh, scripts/demo.sh and docker/Dockerfile all call it.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
type=${2:-RelWithDebInfo}
shift $(( $# < 2 ? $# : 2 ))
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" "$@"
cmake --build "$dir" ${SLIDE_BUILD_TARGETS:+--target $SLIDE_BUILD_TARGETS}
