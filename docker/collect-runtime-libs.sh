#!/usr/bin/env bash
# Copies binaries and every shared library they load (ldd), except the C runtime and the NVIDIA driver (which
# the container toolkit mounts), into PREFIX/bin and PREFIX/lib: the runtime image needs nothing else.
# Usage: collect-runtime-libs.sh PREFIX BINARY...
set -euo pipefail
prefix=$1; shift
mkdir -p "$prefix/bin" "$prefix/lib"
for bin in "$@"; do cp "$bin" "$prefix/bin/"; done
for bin in "$@"; do ldd "$bin"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libnvidia-[^/]*)\.so' |
  while read -r lib; do
    cp -L "$lib" "$prefix/lib/"
    # Loaded later with dlopen, so ldd does not list them: cuDNN's engine libraries, NVRTC's builtins.
    case "$(basename "$lib")" in
      libtorch_cpu.so) cp -L "$(dirname "$lib")"/lib*.so* "$prefix/lib/" ;;  # LibTorch loads some of its own lazily
      libcudnn.so*) cp -L "$(dirname "$lib")"/libcudnn_*.so* "$prefix/lib/" ;;
      libnvrtc.so*) cp -L "$(dirname "$lib")"/libnvrtc-builtins*.so* "$prefix/lib/" 2>/dev/null || true ;;
    esac
  done
echo "collect-runtime-libs: $(ls "$prefix/lib" | wc -l) libraries, $(du -sh "$prefix" | cut -f1)"
