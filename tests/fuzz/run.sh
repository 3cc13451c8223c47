#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (build-fuzz/) and runs each for RUNS executions (default 10 million)
# or FUZZ_SECONDS (when set), whichever ends first, from its seed corpus, two at a time; a crash leaves its input
# in build-fuzz/crashes/. One JSON line per target goes to build-fuzz/fuzz.jsonl (executions, seconds, exec/s,
# corpus size, the input size limit, result). Inputs are capped near what each parser meets in use: slidectl job
# files and slided configs (a few hundred bytes in use) at 8 KiB, where yaml-cpp's per-character scanning would
# otherwise make the later, longer inputs 3x slower; tokenizer.json and dataset lines at 64 KiB (long unbroken
# lines are where a quadratic BPE once hid). ASan keeps no allocation stacks (malloc_context_size=0, ~25% more
# executions); replay a crash input with the default options to see them. One allocation above 1 GiB is a finding
# (-malloc_limit_mb): no input of these sizes should make a parser reserve that much (a tokenizer.json id table once
# did: 1.2 GB from 64 KiB).
#   [FUZZ_SECONDS=N] [FUZZ_HARDWARE=TEXT] tests/fuzz/run.sh [RUNS] [TARGET...]
#   tests/fuzz/run.sh seeds      build, then only replay every seed corpus (the ctests; .ci/run's fuzz step)
set -uo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-10000000}; shift || true
targets=${*:-safetensors_fuzz hf_config_fuzz tokenizer_json_fuzz tokenizer_encode_fuzz dataset_fuzz job_file_fuzz daemon_config_fuzz chat_template_fuzz}
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  mkdir -p build-fuzz
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSLIDE_FUZZ=ON -DSLIDE_BUILD_TESTS=OFF \
    -DSLIDE_BUILD_BENCH=OFF -DSLIDE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo > build-fuzz/cmake.log 2>&1 ||
    { tail -30 build-fuzz/cmake.log; rm -f build-fuzz/CMakeCache.txt; exit 1; }
fi
cmake --build build-fuzz --target $targets || exit 1
if [ "$runs" = seeds ]; then
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-fuzz --output-on-failure -j2 --timeout 600
  exit
fi
mkdir -p build-fuzz/crashes build-fuzz/work
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:malloc_context_size=0 UBSAN_OPTIONS=print_stacktrace=1
max_len_of() { case $1 in job_file_fuzz|daemon_config_fuzz) echo 8192 ;; *) echo 65536 ;; esac; }
fuzz_one() {
  local t=$1 corpus=build-fuzz/work/$1 start=$SECONDS max_len=$(max_len_of "$1")
  rm -rf "$corpus"; mkdir -p "$corpus"
  build-fuzz/tests/fuzz/$t -runs="$runs" -max_total_time="${FUZZ_SECONDS:-0}" -max_len=$max_len -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=1024 \
    -artifact_prefix=build-fuzz/crashes/$t- "$corpus" tests/fuzz/corpus/$t > build-fuzz/$t.log 2>&1
  local rc=$? secs=$((SECONDS - start))
  local done_line=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' build-fuzz/$t.log | tail -1)
  local execs=$(echo "$done_line" | sed -E 's/^#([0-9]+).*/\1/')
  local eps=$(echo "$done_line" | sed -nE 's/.*exec\/s: ([0-9]+).*/\1/p')
  local found=$(ls "$corpus" | wc -l)
  echo "{\"commit\": \"$(git rev-parse --short HEAD)\", \"hardware\": \"${FUZZ_HARDWARE:-$(nproc) cores}\", \"max_len\": $max_len, \"date\": \"$(date -u +%FT%TZ)\", \"bench\": \"fuzz\", \"target\": \"$t\", \"runs\": ${execs:-0}, \"seconds\": $secs, \"exec_per_s\": ${eps:-0}, \"corpus\": $found, \"exit\": $rc, \"result\": \"$([ $rc = 0 ] && echo clean || echo "crash: see build-fuzz/$t.log")\"}" >> build-fuzz/fuzz.jsonl
  echo "$t: rc=$rc after $secs s, $execs runs"
}
set -- $targets
while [ $# -gt 0 ]; do
  fuzz_one "$1" & [ $# -gt 1 ] && { fuzz_one "$2" & shift; }
  wait; shift
done
