#!/usr/bin/env bash
# Downloads the Debian 12 packages the GPU build box lacks into DIR (default .gpu-debs), including the ones this
# project adds to the shared recipe (nlohmann-json, CLI11, PCRE2, ICU, cpp-httplib; brotli's headers only, for
# cpp-httplib's pkg-config file: the box has the library). Then, there: `source DIR/gpu-env.sh DIR`
# (gpu-env.sh comes from ../shared/device/). bench/run_gpu.sh uses it.
set -euo pipefail
dir=${1:-.gpu-debs}
mkdir -p "$dir"
cp ../shared/device/gpu-env.sh "$dir/" 2>/dev/null || true
bash ../shared/device/fetch-debs.sh "$dir"
cd "$dir"
apt-get download nlohmann-json3-dev libcli11-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
  libicu-dev libicu72 libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev 2>&1 | grep -vE '^(Get:|Fetched|W: Download is performed unsandboxed)' || true
ls -1 *.deb | wc -l | xargs echo "packages in $dir:"
