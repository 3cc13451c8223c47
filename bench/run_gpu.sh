#!/usr/bin/env bash
# The GPU box's driver (see ../shared/device): builds, runs the GPU tests, and runs named benchmark sets kept as data
# in bench/runs/*.yaml (bench/run_set.cc). Writes logs and JSON lines under $OUT (default ./gpu-out); needs the
# carried Debian packages in .gpu-debs/ (scripts/fetch-gpu-debs.sh) and, for the peers, .peer-wheels/
# (bench/peers/fetch-wheels.sh). One device call allows 10 minutes; each command below fits one.
#   bench/run_gpu.sh build       configure + build, every GPU test (ctest -L gpu), the CPU AdamW benchmark
#   bench/run_gpu.sh set NAME    the runs of bench/runs/NAME.yaml (targets, peers, memory, tier, kernels, nvme):
#                                builds what the set names, takes its setup steps (deepspeed), runs it, and adds each
#                                step trace's summary (bench/trace_summary.py) to bench.jsonl; SET_FLAGS passes
#                                run_set's --only NAME,NAME and --budget S (a set split over two calls)
#   bench/run_gpu.sh daemon      slided's GPU tests: the demo, kill -9 and SIGTERM resume, the 50-watcher load
#   bench/run_gpu.sh largest     the deepest llama-8b@LAYERS model trained on this box without and with the NVMe tier,
#                                sized from the memory plan (--plan-only) against free memory and disk; with
#                                LARGEST_OPTIMIZER=adamw_8bit the 8-bit moments (the tier then holds moments only)
#   bench/run_gpu.sh lora [32b]  LoRA (adapter mode): builds, the GPU tests, then sliding_bench --lora-r 16 against
#                                Hugging Face PEFT (bench/peers/peer_train.py peft; wheels from .peer-wheels) at 8B
#                                batch 8 and 32; with 32b, the Qwen2.5-32B-shaped model (bench/shapes/) instead
#   bench/run_gpu.sh qlora       QLoRA (NF4 base): builds, the GPU tests, kernel_bench nf4 (the dequantisation's GB/s), then
#                                sliding_bench on the Llama-3-70B-shaped model (bench/shapes/) with --lora-r 16 --qlora at
#                                batch 8 and 32 (micro-batches of 8), 24 GiB budget
#   bench/run_gpu.sh qlora-peer  PEFT + bitsandbytes QLoRA on the whole card at QLORA_PEER_SHAPE (llama-70b) batch 8
#                                (bench/peers/peer_train.py qlora)
#   bench/run_gpu.sh q8          8-bit AdamW's CPU update (issue 38): builds, the 8-bit tests (AVX-512 bodies against
#                                NearestCode and the scalar path) and the streamed / weights-first GPU tests,
#                                cpu_adamw_bench, then the real-corpus quality run (QUALITY=corpus bench/quality_8bit.sh; carry
#                                .quality/ from scripts/make_quality_corpus.py) on this GPU
#   bench/run_gpu.sh ab-build    before/after on one box: unpacks BASE (a `git archive` tarball of an older tree,
#                                default .gl/base.tar.gz) and builds its sliding_bench into build-gpu-base/ beside
#                                this tree's build-gpu/, then runs this tree's GPU tests
#   bench/run_gpu.sh ab          the older tree's sliding_bench (labelled BASE_COMMIT; a tree from 3a5f051 on, whose
#                                bench takes the same flags) and this tree's, alternating, AB_ROUNDS (2) times over
#                                AB_RUNS="shape:batch:checkpoints:weights-first:steps ..." (default the targets: 8B
#                                batch 48 parked on the host with weights first on, 3B batch 32 automatic); run right
#                                after ab-build on the same warm machine
# COMMIT (required) labels every line: the hash of the carried tree (the box's .git can be older than the tree).
set -uo pipefail
phase=${1:-build}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
source .gpu-debs/gpu-env.sh .gpu-debs > "$OUT/env-$phase.log" 2>&1
commit=${COMMIT:?set COMMIT to the commit of the carried tree}
hardware=${HW:-1x H100, 16 cores}

# run SECONDS COMMAND...: its JSON lines into bench.jsonl, labelled; whatever else it prints into bench.err (the peers'
# progress lines, {"phase": ...}, included).
run() {
  timeout "$1" "${@:2}" 2>>"$OUT/bench.err" |
    awk -v err="$OUT/bench.err" '/^\{"phase"/ {print >> err; next} /^\{/ {print; fflush(); next} {print >> err}' |
    sed "s/^{/{\"commit\": \"$commit\", \"date\": \"$(date -u +%FT%TZ)\", \"hardware\": \"$hardware\", /" >> "$OUT/bench.jsonl"
}
build_gpu() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  cmake --build build-gpu -j 16 --target "$@" > "$OUT/build.log" 2>&1 || { grep -E 'error|Error' "$OUT/build.log" | head -30; exit 1; }
}
# gpu_tests SECONDS: the GPU tests (CTest label gpu, each in its own process) into gpu_tests.log, the summary printed.
gpu_tests() {
  timeout "$1" ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 300 > "$OUT/gpu_tests.log" 2>&1
  grep -E 'tests passed|tests failed|\*\*\*Failed|Not Run' "$OUT/gpu_tests.log" | head -20
}
# install_deepspeed: into a side directory (the box's Python is externally managed), DeepSpeed's own packages, then
# DeepSpeed itself built against the box's torch (its ops are compiled just in time, CPU Adam included).
install_deepspeed() {
  python3 -m pip install --no-index --find-links .peer-wheels --no-deps --target /tmp/ds-site hjson msgpack ninja \
    py-cpuinfo pydantic pydantic-core annotated-types typing-inspection einops nvidia-ml-py psutil typing_extensions \
    setuptools wheel > "$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
  DS_BUILD_OPS=0 PYTHONPATH=/tmp/ds-site python3 -m pip install --no-index --find-links .peer-wheels --no-deps \
    --no-build-isolation --target /tmp/ds-site deepspeed >> "$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
  export PYTHONPATH=/tmp/ds-site DS_SKIP_CUDA_CHECK=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=/tmp/ds-site/bin:$PATH
  python3 -c 'import deepspeed, transformers; print("deepspeed", deepspeed.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1
}
# Every 20 s, the host's available memory and each benchmark process's threads by name, state and wait channel,
# into threads.log: a run that stalls shows which thread waits where (the engine names slide-update, slide-cpu,
# slide-nvme-io).
watch_threads() {
  while sleep 20; do
    {
      echo "== $(date -u +%T) $(grep MemAvailable /proc/meminfo)"
      for pid in $(pgrep -f 'sliding_bench|peer_train'); do
        echo "pid $pid $(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-80)"
        for t in /proc/$pid/task/*; do
          echo "$(cat $t/comm 2>/dev/null) $(awk '{print $3}' $t/stat 2>/dev/null) $(cat $t/wchan 2>/dev/null)"
        done | sort | uniq -c | sort -rn | head -12
      done
    } >> "$OUT/threads.log"
  done
}
watch_threads &
watcher=$!
trap 'kill $watcher 2>/dev/null' EXIT
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; lscpu | grep -E 'Model name|^CPU\(s\)|avx512f' | cut -c1-120; free -g; } > "$OUT/hardware.txt" 2>&1
start=$SECONDS
case "$phase" in
  build)
    build_gpu model_tests engine_tests parity_tests optim_tests sliding_bench cpu_adamw_bench run_set
    echo "build ok after $((SECONDS - start)) s"
    gpu_tests 420
    run 120 build-gpu/bench/cpu_adamw_bench $((1 << 28)) 5 ;;
  set)
    set_file=bench/runs/${2:?name a run set: $(ls bench/runs | sed 's/\.yaml//' | tr '\n' ' ')}.yaml
    build_gpu run_set
    build_gpu run_set $(build-gpu/bench/run_set "$set_file" --list build)
    echo "build ok after $((SECONDS - start)) s"
    for step in $(build-gpu/bench/run_set "$set_file" --list setup); do
      case "$step" in
        deepspeed) install_deepspeed ;;
        *) echo "unknown setup step $step"; exit 1 ;;
      esac
    done
    build-gpu/bench/run_set "$set_file" --out "$OUT" --commit "$commit" --hardware "$hardware" --bin build-gpu ${SET_FLAGS:-}
    for trace in "$OUT"/trace-*.json; do
      [ -f "$trace" ] || continue
      tag=$(basename "$trace" .json)
      python3 bench/trace_summary.py "$trace" | sed "s/^{/{\"trace\": \"${tag#trace-}\", /" >> "$OUT/bench.jsonl"
    done ;;
  daemon)
    build_gpu slided daemon_tests make_random_model
    SLIDE_TEST_DEVICE=cuda build-gpu/tests/daemon_tests \
      --gtest_filter='Daemon.Demo*:DaemonState.KillDashNine*:DaemonState.Sigterm*:DaemonState.Fifty*' \
      > "$OUT/daemon_tests.log" 2>&1
    grep -E 'LOAD|OK|FAILED|PASSED|Failure' "$OUT/daemon_tests.log" | head -30
    # The load figure on a real-size job: Llama-3.2-1B shape, batch 8, seq 1024, reads spread over ~25 s.
    build-gpu/bench/make_random_model llama-1b /tmp/llama-1b > "$OUT/make_model.log" 2>&1
    SLIDE_TEST_DEVICE=cuda SLIDE_TEST_MODEL_DIR=/tmp/llama-1b SLIDE_TEST_BATCH=8 SLIDE_TEST_SEQ=1024 \
      SLIDE_LOAD_PACE_MS=100 build-gpu/tests/daemon_tests --gtest_filter='DaemonState.Fifty*' \
      > "$OUT/daemon_load_1b.log" 2>&1
    grep -E 'LOAD|OK|FAILED|Failure' "$OUT/daemon_load_1b.log" | head ;;
  lora)
    if [ "${2:-}" = 32b ]; then
      [ -x build-gpu/bench/sliding_bench ] || build_gpu sliding_bench
      for b in ${LORA_32B_BATCHES:-8}; do
        run 540 build-gpu/bench/sliding_bench bench/shapes/qwen2.5-32b "$b" --lora-r 16 --steps 3 --warmup-steps 2
        echo "32b batch $b done after $((SECONDS - start)) s"
      done
    else
      build_gpu model_tests engine_tests parity_tests sliding_bench
      echo "build ok after $((SECONDS - start)) s"
      gpu_tests "${GPU_TESTS_S:-200}"
      python3 -m pip install --no-index --find-links .peer-wheels --no-deps --target /tmp/peft-site peft accelerate \
        > "$OUT/pip.log" 2>&1 || tail -3 "$OUT/pip.log"
      for b in ${LORA_BATCHES:-8 32}; do
        run 200 build-gpu/bench/sliding_bench llama-8b "$b" --lora-r 16 --steps 3 --warmup-steps 2
        echo "ours 8b batch $b done after $((SECONDS - start)) s"
        PYTHONPATH=/tmp/peft-site run 240 python3 bench/peers/peer_train.py peft llama-8b "$b"
        echo "peft 8b batch $b done after $((SECONDS - start)) s"
      done
    fi ;;
  qlora)
    # Builds the LoRA phase's targets too, so `lora` right after on the same warm machine starts at once.
    # QLORA_TESTS=0: sliding_bench alone (drawing and quantising the 70B base takes ~6 minutes of a call).
    if [ "${QLORA_TESTS:-1}" = 0 ]; then
      build_gpu sliding_bench
    else
      build_gpu quant_tests engine_tests model_tests parity_tests optim_tests kernel_bench sliding_bench
      echo "build ok after $((SECONDS - start)) s"
      gpu_tests "${GPU_TESTS_S:-200}"
      run 120 build-gpu/bench/kernel_bench 8192 "${COPY_GBPS:-3000}" nf4
    fi
    for b in ${QLORA_BATCHES:-8 32}; do
      run "${QLORA_RUN_S:-420}" build-gpu/bench/sliding_bench bench/shapes/llama-3-70b "$b" --micro-batch 8 --lora-r 16 \
        --qlora --steps "${QLORA_STEPS:-2}" --warmup-steps 1
      echo "70b qlora batch $b done after $((SECONDS - start)) s"
    done ;;
  lora-peer)
    # PEFT alone at LORA_BATCHES on LORA_PEER_SHAPE (llama-8b; bench/shapes/qwen2.5-32b asks whether PEFT trains the
    # 32B shape on the card at all): for a call that cannot also carry .gpu-debs, right after `lora` on the same
    # warm machine.
    python3 -m pip install --no-index --find-links .peer-wheels --no-deps --target /tmp/peft-site peft accelerate \
      psutil > "$OUT/pip.log" 2>&1 || tail -3 "$OUT/pip.log"
    for b in ${LORA_BATCHES:-8 32}; do
      PYTHONPATH=/tmp/peft-site run 240 python3 bench/peers/peer_train.py peft "${LORA_PEER_SHAPE:-llama-8b}" "$b"
      echo "peft ${LORA_PEER_SHAPE:-llama-8b} batch $b done after $((SECONDS - start)) s"
    done ;;
  qlora-peer)
    python3 -m pip install --no-index --find-links .peer-wheels --no-deps --target /tmp/peft-site peft accelerate \
      bitsandbytes psutil > "$OUT/pip.log" 2>&1 || tail -3 "$OUT/pip.log"
    PYTHONPATH=/tmp/peft-site run 420 python3 bench/peers/peer_train.py qlora "${QLORA_PEER_SHAPE:-llama-70b}" 8
    echo "peer qlora done after $((SECONDS - start)) s" ;;
  largest)
    # Batch 8, one timed step. LARGEST_OVERHEAD_GB (default 5): what the CUDA context and libraries take beside the
    # plan's host total (within 1 GiB of the host peak measured at 8B).
    build_gpu sliding_bench
    echo "build ok after $((SECONDS - start)) s"
    dir=/var/tmp/slide-largest; mkdir -p "$dir"
    avail_gb=$(awk '/MemAvailable/ {print int($2 / 1e6)}' /proc/meminfo)
    disk_gb=$(df -B1000000000 --output=avail "$dir" | tail -1 | tr -dc 0-9)
    read -r host_layers tier_total tier_layers <<< "$(python3 - "$avail_gb" "$disk_gb" "$dir" <<'PY'
import json, os, subprocess, sys
avail, disk = (float(a) * 1e9 for a in sys.argv[1:3])
overhead = float(os.environ.get("LARGEST_OVERHEAD_GB", "5")) * 1e9
optimizer = os.environ.get("LARGEST_OPTIMIZER", "adamw")
tier_state = "moments" if optimizer == "adamw_8bit" else "moments_and_master"

def plan(layers, tiered=-1):
    args = ["build-gpu/bench/sliding_bench", f"llama-8b@{layers}", "8", "--plan-only", "--optimizer", optimizer]
    if tiered > 0:
        args += ["--nvme-state", tier_state, "--nvme-layers", str(tiered), "--nvme-dir", sys.argv[3]]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)

def deepest(fits, n):  # the largest depth that fits, walking from n
    while n > 1 and not fits(n):
        n -= 1
    while fits(n + 1):
        n += 1
    return n

host_fits = lambda tiered: lambda n: plan(n, tiered(n))["planned_host_bytes"] + overhead <= avail
plain = deepest(host_fits(lambda n: -1), 32)
k = int((disk - 4e9) // plan(2, 1)["nvme_bytes"])  # the layers whose state the disk holds
tiered = lambda n: min(k, n)  # the last k layers on the tier, or all of them when the model is shallower
deep = deepest(host_fits(tiered), plain)
print(plain, deep, tiered(deep))
PY
)"
    echo "host ${avail_gb} GB available, disk ${disk_gb} GB free: llama-8b@${host_layers} without the tier, llama-8b@${tier_total} with its last ${tier_layers} layers on the tier"
    optimizer=${LARGEST_OPTIMIZER:-adamw}
    tier_state=moments_and_master; [[ $optimizer == adamw_8bit ]] && tier_state=moments
    run 300 build-gpu/bench/sliding_bench "llama-8b@$host_layers" 8 --steps 1 --optimizer "$optimizer"
    echo "without the tier done after $((SECONDS - start)) s"
    run 300 build-gpu/bench/sliding_bench "llama-8b@$tier_total" 8 --steps 1 --optimizer "$optimizer" --nvme-state "$tier_state" \
      --nvme-layers "$tier_layers" --nvme-dir "$dir" --nvme-threads 4 --nvme-buffers 8
    echo "with the tier done after $((SECONDS - start)) s" ;;
  q8)
    build_gpu optim_tests engine_tests cpu_adamw_bench sliding_bench slided slidectl make_random_model
    echo "build ok after $((SECONDS - start)) s"
    timeout 120 build-gpu/tests/optim_tests --gtest_filter='AdamW8bit.*:TensorAdamW8bit.*' > "$OUT/q8_tests.log" 2>&1
    timeout 200 build-gpu/tests/engine_tests --gtest_filter="${Q8_ENGINE_TESTS:-SlidingTrainer.*Streamed*_CUDA:SlidingTrainer.*WeightsFirst*_CUDA:SlidingTrainer.*AdamW8bit*_CUDA}" >> "$OUT/q8_tests.log" 2>&1
    grep -E 'OK|FAILED|PASSED|Failure' "$OUT/q8_tests.log" | head -40
    [ "${Q8_KERNEL_BENCH:-1}" = 0 ] || run 150 build-gpu/bench/cpu_adamw_bench $((1 << 28)) 3
    COMMIT=$commit HW="$hardware" BUILD=build-gpu QUALITY=corpus DEVICE=cuda KEEP=1 \
      timeout 330 bash bench/quality_8bit.sh "${Q8_STEPS:-300}" 2> "$OUT/quality.err" | tee -a "$OUT/bench.jsonl"
    for d in /tmp/tmp.*; do [ -f "$d/slided.log" ] && tail -c 1500 "$d/slided.log"; done
    echo "q8 done after $((SECONDS - start)) s" ;;
  ab-build)
    rm -rf build-gpu-base && mkdir -p build-gpu-base/src && tar xzf "${BASE:-.gl/base.tar.gz}" -C build-gpu-base/src
    ( cmake -S build-gpu-base/src -B build-gpu-base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIDE_BUILD_TESTS=OFF \
        > "$OUT/cmake-base.log" 2>&1 &&
      cmake --build build-gpu-base/b -j 8 --target sliding_bench > "$OUT/build-base.log" 2>&1
      echo "base build rc=$? after $((SECONDS - start)) s" ) &
    base_build=$!
    build_gpu model_tests engine_tests parity_tests optim_tests sliding_bench
    echo "build ok after $((SECONDS - start)) s"
    wait "$base_build"  # not the thread watcher
    gpu_tests "${GPU_TESTS_S:-360}"
    echo "gpu tests done after $((SECONDS - start)) s" ;;
  ab)
    base_commit=${BASE_COMMIT:?set BASE_COMMIT to the commit of the base tarball}
    for round in $(seq "${AB_ROUNDS:-2}"); do
      for spec in ${AB_RUNS:-llama-8b:48:host:on:3 llama-3b:32:auto:auto:6}; do
        IFS=: read -r shape b ck wf steps <<< "$spec"
        commit=$base_commit
        run 240 build-gpu-base/b/bench/sliding_bench "$shape" "$b" --steps "$steps" --checkpoints "$ck" --weights-first "$wf"
        echo "round $round base $shape $b done after $((SECONDS - start)) s"
        commit=$COMMIT
        run 240 build-gpu/bench/sliding_bench "$shape" "$b" --steps "$steps" --checkpoints "$ck" --weights-first "$wf"
        echo "round $round new $shape $b done after $((SECONDS - start)) s"
      done
    done ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
cat "$OUT/bench.jsonl" 2>/dev/null; tail -5 "$OUT/bench.err" 2>/dev/null; true
