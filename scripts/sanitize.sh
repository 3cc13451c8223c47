#!/usr/bin/env bash
# The unit, engine and daemon suites under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/), and the
# thread pool's, the NVMe tier's and the job manager's threaded tests under ThreadSanitizer (build-tsan/; LibTorch is
# not instrumented, so the TSan run keeps to the LibTorch-free libraries). Both builds are CPU-only (SLIDE_CUDA=OFF: LibTorch's CPU libraries imported
# without the CUDA toolkit, cmake/TorchWithoutToolkit.cmake).
#   scripts/sanitize.sh            run both; exit 1 on any test failure or sanitizer report
#   SLIDE_HIDE_CUDA=1 scripts/sanitize.sh
#                                  as root: first hide the CUDA toolkit in a private mount namespace, so the
#                                  run is also the test of a box without one (README's commands on a CPU-only box)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${SLIDE_HIDE_CUDA:-0}" = 1 ] && [ -z "${SLIDE_CUDA_HIDDEN:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
    exec env SLIDE_CUDA_HIDDEN=1 unshare -m bash "$0" "$@"
  fi
  echo "sanitize: cannot make a mount namespace here (needs root and unshare); running with the toolkit visible"
fi
if [ -n "${SLIDE_CUDA_HIDDEN:-}" ]; then
  cuda=$(readlink -f /usr/local/cuda 2>/dev/null || true)
  if [ -n "$cuda" ] && [ -d "$cuda" ]; then mount -t tmpfs tmpfs "$cuda" 2>/dev/null; fi
  for f in $(command -v -a nvcc 2>/dev/null); do mount --bind /dev/null "$f" 2>/dev/null; done
  export PATH=$(echo "$PATH" | sed 's|/usr/local/cuda[^:]*/bin:||g')
  if nvcc --version >/dev/null 2>&1; then
    echo "sanitize: the toolkit could not be hidden here (mounts refused); running with it visible"
  else
    echo "sanitize: CUDA toolkit hidden (${cuda:-none was installed})"
  fi
  bash scripts/install-deps.sh || exit 1  # on a box without the toolkit: adds libcudart/libcupti from PyPI
fi
status=0
mkdir -p build-asan build-tsan
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSLIDE_SANITIZE=ON -DSLIDE_CUDA=OFF \
  -DSLIDE_BUILD_BENCH=OFF > build-asan/cmake.log 2>&1 || { tail -30 build-asan/cmake.log; exit 1; }
suites="common_tests io_tests data_tests chat_tests model_tests optim_tests quant_tests engine_tests parallel_tests job_file_tests
  job_proto_tests job_manager_tests daemon_tests slidectl_tests"
cmake --build build-asan --target $suites || exit 1
for t in $suites; do
  # Reports fail the run: ASan aborts on the first; UBSan halts too (its reports would otherwise only print).
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timeout 3000 build-asan/tests/$t > "build-asan/$t.log" 2>&1
  rc=$?
  echo "sanitize: asan+ubsan $t rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "build-asan/$t.log" | tr '\n' ' ')"
  if [ $rc -ne 0 ]; then status=1; grep -E -A12 'ERROR: AddressSanitizer|runtime error|FAILED  \]' "build-asan/$t.log" | head -40; fi
done
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSLIDE_TSAN=ON -DSLIDE_CUDA=OFF -DSLIDE_BUILD_BENCH=OFF \
  > build-tsan/cmake.log 2>&1 || { tail -30 build-tsan/cmake.log; exit 1; }
cmake --build build-tsan --target common_tests io_tests job_manager_tests || exit 1
for t in common_tests io_tests job_manager_tests; do
  TSAN_OPTIONS=halt_on_error=1 timeout 1500 build-tsan/tests/$t > "build-tsan/$t.log" 2>&1
  rc=$?
  echo "sanitize: tsan $t rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "build-tsan/$t.log" | tr '\n' ' ')"
  if [ $rc -ne 0 ]; then status=1; grep -A20 'WARNING: ThreadSanitizer' "build-tsan/$t.log" | head -40; fi
done
exit $status
