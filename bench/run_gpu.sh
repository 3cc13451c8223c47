#!/usr/bin/env bash
# One batched run on the GPU box (see ../shared/device): build, GPU tests, benchmarks. Writes logs and JSON
# lines under $OUT (default ./gpu-out). Needs the carried Debian packages in .gpu-debs/ (scripts/fetch-gpu-debs.sh).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
source .gpu-debs/gpu-env.sh .gpu-debs > "$OUT/env.log" 2>&1
gen="Unix Makefiles"; command -v ninja >/dev/null && gen=Ninja
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; lscpu | grep -E 'Model name|^CPU\(s\)|avx512f' | cut -c1-120; free -g; } > "$OUT/hardware.txt" 2>&1
cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j 16 > "$OUT/build.log" 2>&1 || { grep -E 'error|Error' "$OUT/build.log" | head -30; exit 1; }
echo "build ok"
ctest --test-dir build-gpu --output-on-failure -j 4 --timeout 300 > "$OUT/ctest.log" 2>&1; echo "ctest rc=$?"
tail -12 "$OUT/ctest.log"
(build-gpu/tests/parity_tests --gtest_filter='*CUDA*'; build-gpu/tests/engine_tests;
 build-gpu/tests/optim_tests) > "$OUT/gpu_tests.log" 2>&1
grep -E 'PARITY|SLIDING|PASSED|FAILED|SKIPPED' "$OUT/gpu_tests.log" | head -30
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
run() { timeout "$1" "${@:2}" 2>>"$OUT/bench.err" | sed "s/^{/{\"commit\": \"$commit\", \"date\": \"$(date -u +%FT%TZ)\", \"hardware\": \"1x H200, 16 cores\", /" >> "$OUT/bench.jsonl"; }
run 120 build-gpu/bench/cpu_adamw_bench $((1 << 28)) 5
# Batch sweep with exact clipping, and the same shapes without clipping: the critical batch size (where the
# step stops being bound by the CPU update) and what exact clipping costs.
for spec in "llama-1b 16" "llama-3b 4" "llama-3b 8" "llama-3b 12" "llama-3b 16"; do run 150 build-gpu/bench/sliding_bench $spec 1024 3 2 cuda 1.0; done
for spec in "llama-3b 8" "llama-3b 16"; do run 150 build-gpu/bench/sliding_bench $spec 1024 3 2 cuda 0; done
run 240 build-gpu/bench/sliding_bench llama-8b 8 1024 2 2 cuda 1.0
run 240 build-gpu/bench/sliding_bench llama-8b 16 1024 2 2 cuda 1.0
cat "$OUT/bench.jsonl"; tail -5 "$OUT/bench.err" 2>/dev/null
