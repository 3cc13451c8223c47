#!/usr/bin/env bash
# Batched runs on the GPU box (see ../shared/device): build the engine targets, GPU tests, benchmarks. Writes
# logs and JSON lines under $OUT (default ./gpu-out). Needs the carried Debian packages in .gpu-debs/
# (scripts/fetch-gpu-debs.sh). One device call allows 10 minutes, so the work comes in phases:
#   bench/run_gpu.sh build   configure + build, then every GPU test (ctest -L gpu) and the CPU AdamW benchmark
#   bench/run_gpu.sh sweep   1B and 3B: batch sweep with exact clipping, and 3B without clipping
#   bench/run_gpu.sh large   8B at batch 8 and 16
#   bench/run_gpu.sh daemon  slided on the GPU: kill -9 / SIGTERM resume and the 50-watcher load figure
#   bench/run_gpu.sh extra   3B window (prefetch depth) 1 and 4; checkpoint cost of a 1B job through slided
#   bench/run_gpu.sh nvme    the NVMe tier's store against dd (O_DIRECT) on the box's disk
#   bench/run_gpu.sh tier    io_tests and the tier's CPU equivalence tests on the box's disk, then 3B batch 16 with
#                            the optimizer state on the NVMe tier (moments and master; moments) and without it
#   bench/run_gpu.sh peers   ours (sliding_bench) beside plain PyTorch + HF, FSDP2 CPU offload and DeepSpeed
#                            ZeRO-3 offload (bench/peers/peer_train.py; DeepSpeed from the wheels in .peer-wheels,
#                            fetched by bench/peers/fetch-wheels.sh) on the 1B and 3B shapes, batch 8
#                            (PEER_RUNS="peer:shape:batch ..." lists the runs; fwdbwd is PyTorch+HF forward+backward
#                            alone, the GPU-work ceiling)
#   bench/run_gpu.sh critical CUDA engine tests, then 8B with layer inputs parked on the host at batch 48 (weights
#                            first on and off) and 40 (exact clipping's critical batch) beside PyTorch+HF
#                            forward+backward at batch 8
#   bench/run_gpu.sh weights CUDA engine tests, the CPU AdamW whole update against its weights-only pass, then the
#                            weights-first schedule off and on at WEIGHTS_RUNS="shape:batch:checkpoints ..." (default
#                            8B batch 32, then 3B batch 32, layer inputs on the device)
#   bench/run_gpu.sh targets the issue's speed targets in one call: 8B at the critical batch (inputs parked on the
#                            host) beside PyTorch+HF forward+backward at batch 8, 3B batch 32 beside DeepSpeed
#   bench/run_gpu.sh hugepages the host state on transparent huge pages against small pages: CPU AdamW, 3B and 8B
#                            batch 32, with DeepSpeed at 3B batch 32 in the same call (SKIP_DEEPSPEED=1 leaves it out)
#   bench/run_gpu.sh ours    ours alone, traced, at OURS_RUNS="shape:batch:weights-first:steps ..." (default 8B b32)
#   bench/run_gpu.sh largest the largest llama-8b@LAYERS model ours trains on the box without and with the NVMe
#                            tier (sized from its free memory and disk), then LARGEST_PEERS="peer:shape ..." supervised
#   bench/run_gpu.sh kernels the fused kernels' GPU tests, kernel_bench, and the engine with/without them (E2E=;
#                            KERNEL_TESTS_ONLY=1 leaves out the HF parity and engine CUDA tests)
#   bench/run_gpu.sh resident GPU tests (kernels, AdamW kernel, CUDA engine tests), then sliding_bench with the
#                            resident layers the 24 GiB budget holds against none (RESIDENT_SPECS="shape:batch ...")
#   bench/run_gpu.sh memory  the GPU tests (engine, kernels, HF parity), then sliding_bench with each phase's peak device
#                            memory beside the plan's estimate (MEMORY_RUNS="shape:batch[:checkpoints[:resident]] ...",
#                            checkpoints auto|device|host, resident layers auto or a count)
#   bench/run_gpu.sh matrix  sliding_bench over MATRIX_RUNS="shape:batch:max_grad_norm ..." as slided runs GPU jobs
#                            (automatic resident layers, streamed-update share SHARE=0.3)
#   bench/run_gpu.sh stream  sliding_bench with a share of the host layers updated on the GPU against none, weights
#                            first automatic (STREAM_RUNS="shape:batch:share:checkpoints ...", resident layers automatic)
#   bench/run_gpu.sh engine2 build, CUDA engine tests, the HF one-layer reference, 8B/3B with step traces
#                            (trace_summary.py lines in bench.jsonl), other families from bench/configs/
#   bench/run_gpu.sh ab-build before/after on one box: unpacks BASE (a `git archive` tarball of the old tree, default
#                            .gl/base.tar.gz, carried) and builds its sliding_bench into build-gpu-base/ beside this
#                            tree's build-gpu/, then runs every GPU test (ctest -L gpu) of this tree
#   bench/run_gpu.sh ab      the old tree's sliding_bench (labelled BASE_COMMIT) and this tree's, alternating, at
#                            AB_RUNS="shape:batch:checkpoints:weights-first:steps ..." (default the targets: 8B batch 48
#                            with layer inputs on the host, weights first on; 3B batch 32, weights first automatic),
#                            AB_ROUNDS times (default 2); run right after ab-build on the same warm machine
set -uo pipefail
phase=${1:-build}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
source .gpu-debs/gpu-env.sh .gpu-debs > "$OUT/env-$phase.log" 2>&1
# COMMIT: the hash of the tree being run, given from the machine it was carried from (the GPU box's copy of .git
# can be older than the tree it runs: a 62517c3 run once labelled itself with an earlier commit).
commit=${COMMIT:?set COMMIT to the commit of the carried tree}
# run SECONDS COMMAND...: its JSON lines into bench.jsonl, labelled; whatever else it prints (a peer's warnings go to
# stdout) into bench.err.
run() {
  timeout "$1" "${@:2}" 2>>"$OUT/bench.err" | awk -v err="$OUT/bench.err" '/^\{/ {print; fflush(); next} {print >> err}' |
    sed "s/^{/{\"commit\": \"$commit\", \"date\": \"$(date -u +%FT%TZ)\", \"hardware\": \"${HW:-1x H200, 16 cores}\", /" >> "$OUT/bench.jsonl"
}
# watch_threads &: every 20 s, the host's available memory and each benchmark process's threads counted by name,
# state and kernel wait channel (with their CPU seconds) into threads.log, so a run that stalls shows which thread
# waits where and whether it still burns CPU (the engine names its threads slide-update, slide-cpu, slide-nvme-io).
watch_threads() {
  while sleep 20; do
    {
      echo "== $(date -u +%T) $(grep MemAvailable /proc/meminfo)"
      for pid in $(pgrep -f 'sliding_bench|peer_train'); do
        echo "pid $pid $(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-80)"
        for t in /proc/$pid/task/*; do
          echo "$(cat $t/comm 2>/dev/null) $(awk '{print $3}' $t/stat 2>/dev/null) $(cat $t/wchan 2>/dev/null)"
        done | sort | uniq -c | sort -rn | head -12
        awk '{printf "cpu seconds %.1f\n", ($14 + $15) / 100}' /proc/$pid/stat 2>/dev/null
      done
    } >> "$OUT/threads.log"
  done
}
# bench ARGS...: sliding_bench with the last step's trace summarised into bench.jsonl (TAG names the trace file).
traced() {
  local tag=$1; shift
  SLIDE_TRACE_OUT="$OUT/trace-$tag.json" run "${TRACED_TIMEOUT_S:-240}" build-gpu/bench/sliding_bench "$@"
  [ -f "$OUT/trace-$tag.json" ] && python3 bench/trace_summary.py "$OUT/trace-$tag.json" | sed "s/^{/{\"trace\": \"$tag\", /" >> "$OUT/bench.jsonl"
}
# build_gpu TARGETS...: configure (Ninja, Release) and build the targets into build-gpu; exits on failure.
build_gpu() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  cmake --build build-gpu -j 16 --target "$@" > "$OUT/build.log" 2>&1 || { grep -E 'error|Error' "$OUT/build.log" | head -30; exit 1; }
}
# gpu_tests SECONDS [REGEX]: the GPU tests (CTest label gpu, each in its own process as ctest runs them) whose names
# match REGEX into $OUT/gpu_tests.log, the summary printed; their binaries must be built.
gpu_tests() {
  timeout "$1" ctest --test-dir build-gpu -L gpu ${2:+-R "$2"} --output-on-failure --timeout 300 > "$OUT/gpu_tests.log" 2>&1
  grep -E 'tests passed|tests failed|\*\*\*Failed|Not Run' "$OUT/gpu_tests.log" | head -20
}
# cuda_engine_tests SECONDS: the engine's CUDA tests into $OUT/gpu_tests.log, their summary lines printed.
cuda_engine_tests() {
  timeout "$1" build-gpu/tests/engine_tests --gtest_filter='*CUDA*' > "$OUT/gpu_tests.log" 2>&1
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure|SLIDING' "$OUT/gpu_tests.log" | head -20
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
# peer_run PEER SHAPE BATCH DEADLINE STEPS: bench/peers/peer_train.py under the supervisor, which writes the line
# of a peer that dies without one (the OOM killer's SIGKILL) or overruns DEADLINE seconds.
peer_run() {
  run $(($4 + 20)) python3 bench/peers/supervise.py --deadline "$4" \
    --line "{\"bench\": \"peer\", \"peer\": \"$1\", \"shape\": \"$2\", \"batch\": $3, \"seq\": 1024}" \
    -- python3 bench/peers/peer_train.py "$1" "$2" "$3" 1024 "$5"
}
watch_threads &
watcher=$!
trap 'kill $watcher 2>/dev/null' EXIT
case "$phase" in
  hugepages)
    # The host state on transparent huge pages (the default) against small pages (SLIDE_HUGE_PAGES=0): the box's THP
    # mode and CPU into system.txt, CPU AdamW both ways, ours at 3B batch 32 (automatic) with huge pages beside
    # DeepSpeed at that batch, then ours with small pages and 8B batch 32 weights first both ways, as time allows.
    start=$SECONDS
    { cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; lscpu; } > "$OUT/system.txt" 2>&1
    build_gpu sliding_bench cpu_adamw_bench
    echo "build ok after $((SECONDS - start)) s"
    for hp in 1 0; do SLIDE_HUGE_PAGES=$hp run 90 build-gpu/bench/cpu_adamw_bench $((1 << 28)) 3; done
    SLIDE_WEIGHTS_FIRST=auto traced hp-llama-3b-auto-1 llama-3b 32 1024 6 2 cuda 1.0
    echo "ours llama-3b 32 huge pages done after $((SECONDS - start)) s"
    if [ -z "${SKIP_DEEPSPEED:-}" ]; then
      install_deepspeed
      peer_run deepspeed llama-3b 32 210 3
      echo "deepspeed llama-3b 32 done after $((SECONDS - start)) s"
    fi
    for spec in llama-3b:auto:0:6 llama-8b:on:1:4 llama-8b:on:0:4; do
      IFS=: read -r shape wf hp n <<< "$spec"
      [ $((SECONDS - start)) -lt ${HP_BUDGET_S:-430} ] || { echo "skipped (time): $spec"; continue; }
      SLIDE_HUGE_PAGES=$hp SLIDE_WEIGHTS_FIRST=$wf traced "hp-$shape-$wf-$hp" "$shape" 32 1024 "$n" 2 cuda 1.0
      echo "ours $spec done after $((SECONDS - start)) s"
    done ;;
  ours)
    # Ours alone, traced, at OURS_RUNS="shape:batch:weights-first:steps ..." (default 8B batch 32 on, then auto; 4
    # timed steps), stopping at OURS_BUDGET_S (default 480).
    start=$SECONDS
    build_gpu sliding_bench
    echo "build ok after $((SECONDS - start)) s"
    for spec in ${OURS_RUNS:-llama-8b:32:on:4 llama-8b:32:auto:6}; do
      IFS=: read -r shape b wf n <<< "$spec"
      [ $((SECONDS - start)) -lt ${OURS_BUDGET_S:-480} ] || { echo "skipped (time): $spec"; continue; }
      SLIDE_WEIGHTS_FIRST=$wf traced "ours-$shape-$b-$wf" "$shape" "$b" 1024 "$n" 2 cuda 1.0
      echo "ours $spec done after $((SECONDS - start)) s"
      grep 'sliding_bench: \(warm\|step\)' "$OUT/bench.err" | tail -2
    done ;;
  kernels)
    # The fused kernels: their GPU tests, kernel_bench (each kernel against the unfused ops, bandwidth, the head's
    # peak memory), then the engine with and without the kernels (E2E: "shape batch" pairs, default 3B b8 and
    # 8B b32, exact clipping, window 2).
    start=$SECONDS
    build_gpu kernel_bench sliding_bench model_tests parity_tests engine_tests
    echo "build ok after $((SECONDS - start)) s"
    timeout 120 build-gpu/tests/model_tests --gtest_filter='FusedKernels*:ChunkedLmHead*' > "$OUT/kernel_tests.log" 2>&1
    if [ -z "${KERNEL_TESTS_ONLY:-}" ]; then
      timeout 120 build-gpu/tests/parity_tests --gtest_filter='*CUDA*' >> "$OUT/kernel_tests.log" 2>&1
      timeout 150 build-gpu/tests/engine_tests --gtest_filter='*CUDA*' >> "$OUT/kernel_tests.log" 2>&1
    fi
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure|error' "$OUT/kernel_tests.log" | head -40
    echo "tests done after $((SECONDS - start)) s"
    run 180 build-gpu/bench/kernel_bench 8192 4300
    echo "kernel_bench done after $((SECONDS - start)) s"
    for spec in ${E2E:-"llama-3b:8" "llama-8b:32"}; do
      for k in ${KERNEL_MODES:-1 0}; do
        [ $((SECONDS - start)) -lt 500 ] || { echo "skipped (time): $spec kernels=$k"; continue; }
        SLIDE_KERNELS=$k run 240 build-gpu/bench/sliding_bench ${spec%%:*} ${spec##*:} 1024 2 2 cuda 1.0
        echo "$spec kernels=$k done after $((SECONDS - start)) s"
      done
    done ;;
  resident)
    start=$SECONDS
    { nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; free -g; cat /sys/kernel/mm/transparent_hugepage/enabled; } \
      > "$OUT/hardware.txt" 2>&1
    build_gpu sliding_bench model_tests parity_tests engine_tests optim_tests
    echo "build ok after $((SECONDS - start)) s"
    timeout 100 build-gpu/tests/optim_tests --gtest_filter='TensorAdamW*' > "$OUT/gpu_tests.log" 2>&1
    timeout 100 build-gpu/tests/model_tests --gtest_filter='FusedKernels*:ChunkedLmHead*' >> "$OUT/gpu_tests.log" 2>&1
    timeout 100 build-gpu/tests/parity_tests --gtest_filter='*CUDA*' >> "$OUT/gpu_tests.log" 2>&1
    timeout 150 build-gpu/tests/engine_tests --gtest_filter='*CUDA*' >> "$OUT/gpu_tests.log" 2>&1
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure' "$OUT/gpu_tests.log" | head -40
    echo "tests done after $((SECONDS - start)) s"
    for spec in ${RESIDENT_SPECS:-"llama-3b:8" "llama-8b:8" "llama-3b:16" "llama-8b:32"}; do
      for r in auto 0; do
        [ $((SECONDS - start)) -lt 470 ] || { echo "skipped (time): $spec resident=$r"; continue; }
        SLIDE_RESIDENT=$r run 240 build-gpu/bench/sliding_bench ${spec%%:*} ${spec##*:} 1024 3 2 cuda 1.0
        echo "$spec resident=$r done after $((SECONDS - start)) s"
      done
    done ;;
  stream)
    # The streamed-update share (slided's GPU jobs use kDefaultDeviceUpdateShare; sliding_bench 0 unless told) with
    # weights first automatic: STREAM_RUNS="shape:batch:share:checkpoints ...", 6 timed steps each, traced;
    # STREAM_TESTS=1 runs the CUDA engine tests first.
    start=$SECONDS
    build_gpu sliding_bench ${STREAM_TESTS:+engine_tests}
    echo "build ok after $((SECONDS - start)) s"
    [ -n "${STREAM_TESTS:-}" ] && cuda_engine_tests 120
    for spec in ${STREAM_RUNS:-llama-3b:32:0:device llama-3b:32:0.3:device llama-8b:48:0:host llama-8b:48:0.3:host \
        llama-3b:8:0:device llama-3b:8:0.3:device llama-8b:8:0:device llama-8b:8:0.3:device}; do
      IFS=: read -r shape batch share ckpt <<< "$spec"
      [ $((SECONDS - start)) -lt ${STREAM_DEADLINE:-470} ] || { echo "skipped (time): $spec"; continue; }
      SLIDE_DEVICE_UPDATE_SHARE=$share SLIDE_CHECKPOINTS=$ckpt SLIDE_WEIGHTS_FIRST=auto \
        traced "s-$shape-$batch-$share" "$shape" "$batch" 1024 6 2 cuda 1.0
      echo "$spec done after $((SECONDS - start)) s"
      grep 'sliding_bench: step' "$OUT/bench.err" | tail -1
    done ;;
  memory)
    # What each phase of a step holds on the device against the plan (SLIDE_PHASE_MEMORY=1: a phase_memory line per
    # run), as slided runs GPU jobs: automatic resident layers and checkpoints, the streamed share slided uses.
    start=$SECONDS
    build_gpu sliding_bench engine_tests model_tests parity_tests
    echo "build ok after $((SECONDS - start)) s"
    cuda_engine_tests 150
    if [ "${MEMORY_TESTS:-all}" = all ]; then  # MEMORY_TESTS=engine: the engine's alone
      timeout 100 build-gpu/tests/model_tests --gtest_filter='FusedKernels*:ChunkedLmHead*' > "$OUT/kernel_tests.log" 2>&1
      timeout 100 build-gpu/tests/parity_tests --gtest_filter='*CUDA*' >> "$OUT/kernel_tests.log" 2>&1
      grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure' "$OUT/kernel_tests.log" | head -20
    fi
    echo "tests done after $((SECONDS - start)) s"
    for spec in ${MEMORY_RUNS:-llama-3b:32 llama-8b:8 llama-8b:48:host llama-3b:8}; do
      IFS=: read -r shape batch ckpt resident <<< "$spec"
      [ $((SECONDS - start)) -lt ${MEMORY_DEADLINE:-480} ] || { echo "skipped (time): $spec"; continue; }
      SLIDE_PHASE_MEMORY=1 SLIDE_CHECKPOINTS=${ckpt:-auto} SLIDE_RESIDENT=${resident:-auto} \
        run 200 build-gpu/bench/sliding_bench $shape $batch 1024 3 2 cuda 1.0
      echo "$spec done after $((SECONDS - start)) s"
    done ;;
  matrix)
    # The engine's figures over shapes, batches and clipping as a GPU job runs them (automatic resident layers,
    # streamed-update share SHARE, default 0.3 as in slided): MATRIX_RUNS="shape:batch:max_grad_norm ...".
    start=$SECONDS
    { nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; free -g; } > "$OUT/hardware.txt" 2>&1
    build_gpu sliding_bench
    echo "build ok after $((SECONDS - start)) s"
    for spec in ${MATRIX_RUNS:-"llama-3b:8:1.0" "llama-3b:8:0" "llama-3b:16:1.0" "llama-3b:16:0"}; do
      IFS=: read -r shape batch clip <<< "$spec"
      [ $((SECONDS - start)) -lt ${MATRIX_DEADLINE:-470} ] || { echo "skipped (time): $spec"; continue; }
      SLIDE_DEVICE_UPDATE_SHARE=${SHARE:-0.3} run 200 build-gpu/bench/sliding_bench $shape $batch 1024 3 2 cuda $clip
      echo "$spec done after $((SECONDS - start)) s"
    done ;;
  peers)
    start=$SECONDS
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
    cmake --build build-gpu -j 16 --target sliding_bench > "$OUT/build.log" 2>&1 \
      || { grep -E 'error|Error' "$OUT/build.log" | head -30; exit 1; }
    echo "build ok after $((SECONDS - start)) s"
    # SHAPES (default 1B and 3B) picks the shapes: e.g. SHAPES=llama-8b (each 8B peer run takes about 3 minutes);
    # PEERS a subset of "ours plain fwdbwd fsdp2 deepspeed"; no run starts after PEER_BUDGET_S (default 480) seconds;
    # PEER_RUNS="peer:shape:batch ..." lists the runs instead (e.g. leaving out a peer that cannot fit a batch)
    # BATCH may list several; "critical" is the batch at which our step hides the clipped update (measured: 48 at 8B
    # with the layer inputs parked, 32 at 1B and 3B): BATCH="8 critical" is the issue's whole matrix, e.g. on one's
    # own box: SHAPES="llama-1b llama-3b llama-8b" BATCH="8 critical" PEER_BUDGET_S=36000 bench/run_gpu.sh peers.
    specs=(); for shape in ${SHAPES:-llama-1b llama-3b}; do
      for batch in ${BATCH:-8}; do
        [ "$batch" = critical ] && { batch=32; [[ "$shape" == llama-8b* ]] && batch=48; }
        for peer in ${PEERS:-ours plain fwdbwd fsdp2 deepspeed}; do specs+=("$peer $shape $batch"); done; done; done
    [ -n "${PEER_RUNS:-}" ] && { specs=(); for r in $PEER_RUNS; do specs+=("${r//:/ }"); done; }
    [[ " ${specs[*]} " == *deepspeed* ]] && install_deepspeed
    for spec in "${specs[@]}"; do
      set -- $spec
      [ $((SECONDS - start)) -lt ${PEER_BUDGET_S:-480} ] || { echo "skipped (time): $spec"; continue; }
      # Per run: PEER_TIMEOUT_S, else 170 s (8B: 420 s; building and offloading an 8B model on the host takes
      # minutes).
      limit=${PEER_TIMEOUT_S:-170}; [ -z "${PEER_TIMEOUT_S:-}" ] && [[ "$2" == llama-8b* ]] && limit=420
      # Ours: sliding_bench warms up until the automatic weights-first choice has settled, then 3 timed steps.
      if [ "$1" = ours ]; then run $limit build-gpu/bench/sliding_bench "$2" "$3" 1024 3 2 cuda 1.0
      else
        peer_run "$1" "$2" "$3" "$limit" 3
      fi
      echo "$spec done after $((SECONDS - start)) s"
    done ;;
  critical)
    # Exact clipping's critical batch at 8B: the CUDA engine tests (their equivalence cases park layer inputs on the
    # host), then ours with the inputs parked on the host at CRITICAL_RUNS (batch:weights-first; default 48 on and
    # off, then 40 on), and PyTorch+HF forward+backward alone at batch 8 (its best on an 80 GB card; batch 48 does
    # not fit it) as the reference.
    start=$SECONDS
    build_gpu sliding_bench engine_tests
    echo "build ok after $((SECONDS - start)) s"
    cuda_engine_tests 150
    for spec in ${CRITICAL_RUNS:-48:on 48:off 40:on}; do  # batch:weights-first
      IFS=: read -r b wf <<< "$spec"
      [ $((SECONDS - start)) -lt 420 ] || { echo "skipped (time): batch $b weights first $wf"; continue; }
      SLIDE_WEIGHTS_FIRST=$wf SLIDE_CHECKPOINTS=host run 150 build-gpu/bench/sliding_bench llama-8b $b 1024 3 2 cuda 1.0
      echo "ours batch $b weights first $wf done after $((SECONDS - start)) s"
    done
    peer_run fwdbwd llama-8b 8 100 3 ;;
  weights)
    # Weights first (SlidingOptions::weights_first) against the whole update under exact clipping: the CUDA engine
    # tests (EqualsReferenceWeightsFirst_CUDA among them), the CPU update's two passes on this box's cores, then each
    # run with SLIDE_WEIGHTS_FIRST off and on back to back.
    start=$SECONDS
    build_gpu sliding_bench engine_tests cpu_adamw_bench
    echo "build ok after $((SECONDS - start)) s"
    cuda_engine_tests 150
    run 60 build-gpu/bench/cpu_adamw_bench $((1 << 28)) 3
    for spec in ${WEIGHTS_RUNS:-llama-8b:32:device llama-3b:32:device}; do
      IFS=: read -r shape b ckpt <<< "$spec"
      for wf in off on; do
        [ $((SECONDS - start)) -lt 450 ] || { echo "skipped (time): $spec $wf"; continue; }
        # 6 timed steps (on posts weights first from the warm-up on, so every timed step runs on its updates); the
        # last step's trace names what the engine waited for.
        SLIDE_WEIGHTS_FIRST=$wf SLIDE_CHECKPOINTS=$ckpt traced "wf-$shape-$b-$wf" "$shape" "$b" 1024 6 2 cuda 1.0
        echo "ours $spec weights first $wf done after $((SECONDS - start)) s"
      done
    done ;;
  targets)
    # The issue's two speed targets on one box in one call: ours at 8B with layer inputs parked on the host at the
    # critical batch (TARGET_8B="batch:weights-first", default 48:on) beside PyTorch+HF forward+backward at batch 8
    # (its best on an 80 GB card), then ours at 3B batch 32 (weights first automatic) beside DeepSpeed ZeRO-3 offload
    # at that batch (TARGET_3B_SHARES="default 0" adds a run without streamed updates), DeepSpeed given whatever time
    # is left (its start-up alone takes ~160 s).
    start=$SECONDS
    build_gpu sliding_bench
    echo "build ok after $((SECONDS - start)) s"
    IFS=: read -r b wf <<< "${TARGET_8B:-48:on}"
    SLIDE_WEIGHTS_FIRST=$wf SLIDE_CHECKPOINTS=host traced "t-llama-8b-$b-$wf" llama-8b "$b" 1024 3 2 cuda 1.0
    echo "ours llama-8b $b done after $((SECONDS - start)) s"
    peer_run fwdbwd llama-8b 8 100 3
    echo "fwdbwd llama-8b 8 done after $((SECONDS - start)) s"
    for share in ${TARGET_3B_SHARES:-default}; do  # default: the streamed share slided's jobs run with
      [ "$share" = default ] && share=
      SLIDE_DEVICE_UPDATE_SHARE=$share SLIDE_WEIGHTS_FIRST=auto traced "t-llama-3b-32-${share:-default}" llama-3b 32 1024 6 2 cuda 1.0
      echo "ours llama-3b 32 share ${share:-default} done after $((SECONDS - start)) s"
    done
    left() { echo $(( ${TARGETS_BUDGET_S:-570} - (SECONDS - start) - 20 )); }  # seconds DeepSpeed may take
    if [ "$(left)" -gt 150 ]; then
      install_deepspeed
      peer_run deepspeed llama-3b 32 "$(left)" 3
      echo "deepspeed llama-3b 32 done after $((SECONDS - start)) s"
    else
      echo "skipped (time): deepspeed llama-3b 32 ($(left) s left)"
    fi ;;
  largest)
    # The largest Llama-8B-shaped model (llama-8b@LAYERS: 218M parameters a layer) our engine trains on this box,
    # without and with the NVMe tier, batch 8, one timed step; then the offloading peers (each supervised: a run the
    # OOM killer ends still leaves its line). Sizes come from the memory plan (SLIDE_PLAN_ONLY; within 1 GiB of the
    # host peak measured at 8B) against the box's free memory less LARGEST_OVERHEAD_GB (default 5: the CUDA context
    # and libraries) and its free disk: the deepest model in host memory, and with the tier holding the moments and
    # master of as many of the last layers as the disk can.
    start=$SECONDS
    build_gpu sliding_bench
    echo "build ok after $((SECONDS - start)) s"
    dir=/var/tmp/slide-largest; mkdir -p "$dir"
    avail_gb=$(awk '/MemAvailable/ {print int($2 / 1e6)}' /proc/meminfo)
    disk_gb=$(df -B1000000000 --output=avail "$dir" | tail -1 | tr -dc 0-9)
    read -r host_layers tier_total tier_layers <<< "$(python3 - "$avail_gb" "$disk_gb" <<'PY'
import json, os, subprocess, sys
avail, disk = (float(a) * 1e9 for a in sys.argv[1:3])
overhead = float(os.environ.get("LARGEST_OVERHEAD_GB", "5")) * 1e9

def plan(layers, tiered=-1):
    env = dict(os.environ, SLIDE_PLAN_ONLY="1", SLIDE_NVME_STATE="moments_and_master" if tiered > 0 else "",
               SLIDE_NVME_LAYERS=str(tiered))
    args = ["build-gpu/bench/sliding_bench", f"llama-8b@{layers}", "8", "1024", "1", "2", "cuda", "1.0"]
    return json.loads(subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout)

def deepest(fits, n):  # the largest depth that fits, walking from n
    while n > 1 and not fits(n):
        n -= 1
    while fits(n + 1):
        n += 1
    return n

host_fits = lambda tiered: lambda n: n >= max(tiered, 1) and plan(n, tiered)["planned_host_bytes"] + overhead <= avail
plain = deepest(host_fits(-1), 32)
k = int((disk - 4e9) // plan(2, 1)["nvme_bytes"])
print(plain, deepest(host_fits(k), plain + k // 2), k)
PY
)"
    echo "host ${avail_gb} GB available, disk ${disk_gb} GB free: llama-8b@${host_layers} without the tier, llama-8b@${tier_total} with its last ${tier_layers} layers on the tier"
    for spec in ${LARGEST_RUNS:-"none:${host_layers}:0" "moments_and_master:${tier_total}:${tier_layers}"}; do
      IFS=: read -r mode layers k <<< "$spec"
      [ $((SECONDS - start)) -lt ${LARGEST_DEADLINE:-330} ] || { echo "skipped (time): $spec"; continue; }
      [ "$mode" = none ] && mode=""
      SLIDE_NVME_STATE=$mode SLIDE_NVME_LAYERS=$k SLIDE_NVME_DIR=$dir SLIDE_NVME_THREADS=4 SLIDE_NVME_BUFFERS=8 \
        run ${LARGEST_TIMEOUT_S:-300} build-gpu/bench/sliding_bench llama-8b@$layers 8 1024 1 2 cuda 1.0
      echo "$spec done after $((SECONDS - start)) s"; grep -E "Error|error|what" "$OUT/bench.err" | tail -2
    done
    [[ "${LARGEST_PEERS:-}" == *deepspeed* ]] && install_deepspeed
    for peer in ${LARGEST_PEERS:-}; do  # e.g. "fsdp2:llama-8b deepspeed:llama-8b"
      IFS=: read -r name shape <<< "$peer"
      left=$(( ${LARGEST_BUDGET_S:-560} - (SECONDS - start) ))
      [ $left -gt 60 ] || { echo "skipped (time): $peer"; continue; }
      peer_run "$name" "$shape" 8 "$left" 1
      echo "$peer done after $((SECONDS - start)) s"
    done ;;
  tier)
    # The box's disk (64 GiB free) holds a 3B-shaped model's full optimizer state (12 B/param = 38.5 GB), not an
    # 8B one's (96 GB; moments alone 64 GB).
    start=$SECONDS
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
    cmake --build build-gpu -j 16 --target sliding_bench io_tests engine_tests > "$OUT/build.log" 2>&1 \
      || { grep -E 'error|Error' "$OUT/build.log" | head -30; exit 1; }
    echo "build ok after $((SECONDS - start)) s"; df -h /var/tmp | tail -1; free -g | head -2
    build-gpu/tests/io_tests > "$OUT/io_tests.log" 2>&1; grep -E 'OK|FAILED|PASSED' "$OUT/io_tests.log" | tail -14
    timeout 120 build-gpu/tests/engine_tests --gtest_filter='*Nvme*' > "$OUT/tier_tests.log" 2>&1
    grep -E 'OK|FAILED|PASSED' "$OUT/tier_tests.log" | tail -6
    dir=/var/tmp/slide-tier; mkdir -p "$dir"
    specs=("moments_and_master llama-3b 16 1024 2 2 cuda 1.0" "moments llama-3b 16 1024 2 2 cuda 1.0"
           "none llama-3b 16 1024 2 2 cuda 1.0")
    # The 8B shape's moments and master take 96 GB of disk: run it first where the disk has room (the 2-GPU kind's
    # 128 GiB), one step after the warm-up (each step streams 192 GB through the disk).
    free_gb=$(df -BG --output=avail "$dir" | tail -1 | tr -dc 0-9)
    [ "${free_gb:-0}" -ge 100 ] && specs=("moments_and_master llama-8b 32 1024 1 2 cuda 1.0" "${specs[@]}")
    echo "tier disk: ${free_gb:-?} GB free"
    for spec in "${specs[@]}"; do
      [ $((SECONDS - start)) -lt 470 ] || { echo "skipped (time): $spec"; continue; }
      mode=${spec%% *}; [ "$mode" = none ] && mode=""
      limit=300; [[ "$spec" == *llama-8b* ]] && limit=540  # 8B: ~2 minutes a step at this kind of disk's rate
      SLIDE_NVME_STATE=$mode SLIDE_NVME_DIR=$dir SLIDE_NVME_THREADS=4 SLIDE_NVME_BUFFERS=8 \
        run $limit build-gpu/bench/sliding_bench ${spec#* }
      echo "$spec done after $((SECONDS - start)) s"; grep -E "optimizer state|Error|error" "$OUT/bench.err" | tail -2
    done ;;
  nvme)
    gen="Unix Makefiles"; command -v ninja >/dev/null && gen=Ninja
    cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release -DSLIDE_BUILD_TESTS=ON > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
    cmake --build build-gpu -j 16 --target nvme_bench io_tests > "$OUT/build.log" 2>&1 || { grep -E 'error' "$OUT/build.log" | head; exit 1; }
    build-gpu/tests/io_tests > "$OUT/io_tests.log" 2>&1; grep -E 'OK|FAILED|PASSED|SKIPPED' "$OUT/io_tests.log" | head -12
    dir=/var/tmp/slide-nvme-bench; mkdir -p "$dir"; df -h "$dir" | tail -1; uname -r
    for spec in "auto 256 2 32 1024" "auto 256 4 64 1024" "pread 256 4 32 1024"; do
      run 120 build-gpu/bench/nvme_bench "$dir" 8 $spec; done
    # dd with O_DIRECT: one request in flight, the reference the tier is measured against.
    for bs in 1M 16M; do
      w=$(dd if=/dev/zero of="$dir/dd.bin" bs=$bs count=$((8192 / ${bs%M})) oflag=direct 2>&1 | tail -1)
      r=$(dd if="$dir/dd.bin" of=/dev/null bs=$bs iflag=direct 2>&1 | tail -1)
      echo "{\"commit\": \"$commit\", \"date\": \"$(date -u +%FT%TZ)\", \"hardware\": \"1x H200 box, its local disk\", \"bench\": \"dd_o_direct\", \"bs\": \"$bs\", \"write\": \"$w\", \"read\": \"$r\"}" >> "$OUT/bench.jsonl"
      rm -f "$dir/dd.bin"
    done ;;
  engine2)
    gen="Unix Makefiles"; command -v ninja >/dev/null && gen=Ninja
    cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
    cmake --build build-gpu -j 16 --target engine_tests sliding_bench > "$OUT/build.log" 2>&1 \
      || { grep -E 'error|Error' "$OUT/build.log" | head -30; exit 1; }
    echo "build ok $(date +%T)"
    timeout 150 build-gpu/tests/engine_tests --gtest_filter='*CUDA*' > "$OUT/gpu_tests.log" 2>&1
    grep -E 'OK|FAILED|PASSED|SKIPPED' "$OUT/gpu_tests.log" | head -20
    for ref in "4096 14336 32 8 32 1024" "4096 14336 32 8 8 1024" "3072 8192 24 8 8 1024"; do
      timeout 90 python3 bench/hf_layer_reference.py $ref >> "$OUT/bench.jsonl" 2>>"$OUT/bench.err"; done
    echo "reference ok $(date +%T)"
    traced 8b-b32-clip llama-8b 32 1024 2 2 cuda 1.0
    traced 3b-b8-clip llama-3b 8 1024 3 2 cuda 1.0
    traced 3b-b8-noclip llama-3b 8 1024 3 2 cuda 0
    traced 8b-b32-noclip llama-8b 32 1024 2 2 cuda 0
    traced 3b-b16-clip llama-3b 16 1024 3 2 cuda 1.0
    rm -f "$OUT"/trace-3b-b16-clip.json "$OUT"/trace-3b-b8-noclip.json "$OUT"/trace-8b-b32-noclip.json ;;
  engine2b)
    # Steady-state figures (mean Step() time) for the issue's matrix; each run only while the call has time.
    start=$SECONDS
    [ -x build-gpu/bench/sliding_bench ] || { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1; \
      cmake --build build-gpu -j 16 --target sliding_bench > "$OUT/build.log" 2>&1 || exit 1; }
    echo "build ok after $((SECONDS - start)) s"
    for spec in "8b-b32-clip llama-8b 32 1024 2 2 cuda 1.0" "8b-b16-clip llama-8b 16 1024 2 2 cuda 1.0" \
                "8b-b8-clip llama-8b 8 1024 2 2 cuda 1.0" "3b-b8-clip llama-3b 8 1024 3 2 cuda 1.0" \
                "3b-b8-noclip llama-3b 8 1024 3 2 cuda 0" "8b-b16-noclip llama-8b 16 1024 2 2 cuda 0" \
                "qwen25-7b-b16 bench/configs/qwen2.5-7b 16 1024 2 2 cuda 1.0"; do
      [ $((SECONDS - start)) -lt 470 ] || { echo "skipped (time): $spec"; continue; }
      traced $spec
    done
    rm -f "$OUT"/trace-*.json ;;
  ab-build)
    start=$SECONDS
    rm -rf build-gpu-base && mkdir -p build-gpu-base/src && tar xzf "${BASE:-.gl/base.tar.gz}" -C build-gpu-base/src
    ( cmake -S build-gpu-base/src -B build-gpu-base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIDE_BUILD_TESTS=OFF \
        > "$OUT/cmake-base.log" 2>&1 &&
      cmake --build build-gpu-base/b -j 8 --target sliding_bench > "$OUT/build-base.log" 2>&1
      echo "base build rc=$? after $((SECONDS - start)) s" ) &
    build_gpu model_tests engine_tests parity_tests optim_tests sliding_bench
    echo "build ok after $((SECONDS - start)) s"
    wait
    gpu_tests "${GPU_TESTS_S:-360}"
    echo "gpu tests done after $((SECONDS - start)) s" ;;
  ab)
    start=$SECONDS
    base_commit=${BASE_COMMIT:?set BASE_COMMIT to the commit of the base tarball}
    for round in $(seq "${AB_ROUNDS:-2}"); do
      for spec in ${AB_RUNS:-llama-8b:48:host:on:3 llama-3b:32::auto:6}; do
        IFS=: read -r shape b ck wf steps <<< "$spec"
        for side in base new; do
          bin=build-gpu/bench/sliding_bench label=$COMMIT
          [ "$side" = base ] && bin=build-gpu-base/b/bench/sliding_bench label=$base_commit
          if [ -n "$ck" ]; then export SLIDE_CHECKPOINTS=$ck; else unset SLIDE_CHECKPOINTS; fi
          commit=$label
          SLIDE_WEIGHTS_FIRST=$wf run 240 "$bin" "$shape" "$b" 1024 "$steps" 2 cuda 1.0
          echo "round $round $side $shape $b done after $((SECONDS - start)) s"
        done
      done
    done
    commit=$COMMIT ;;
  build)
    gen="Unix Makefiles"; command -v ninja >/dev/null && gen=Ninja
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; lscpu | grep -E 'Model name|^CPU\(s\)|avx512f' | cut -c1-120; free -g; } > "$OUT/hardware.txt" 2>&1
    cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
    cmake --build build-gpu -j 16 --target model_tests engine_tests parity_tests optim_tests sliding_bench \
      cpu_adamw_bench > "$OUT/build.log" 2>&1 || { grep -E 'error|Error' "$OUT/build.log" | head -30; exit 1; }
    echo "build ok"
    gpu_tests 420
    run 120 build-gpu/bench/cpu_adamw_bench $((1 << 28)) 5 ;;
  sweep)
    # Exact clipping, batch sweep: the critical batch size is where the step stops being bound by the CPU
    # update. The same shapes without clipping give what exact clipping costs.
    for spec in "llama-1b 8" "llama-1b 16" "llama-3b 4" "llama-3b 8" "llama-3b 12" "llama-3b 16"; do
      run 120 build-gpu/bench/sliding_bench $spec 1024 3 2 cuda 1.0; done
    for spec in "llama-3b 8" "llama-3b 16"; do run 120 build-gpu/bench/sliding_bench $spec 1024 3 2 cuda 0; done ;;
  large)
    for b in 8 16; do run 240 build-gpu/bench/sliding_bench llama-8b $b 1024 2 2 cuda 1.0; done
    run 200 build-gpu/bench/sliding_bench llama-8b 8 1024 2 2 cuda 0 ;;
  daemon)
    gen="Unix Makefiles"; command -v ninja >/dev/null && gen=Ninja
    [ -f build-gpu/CMakeCache.txt ] || cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1
    cmake --build build-gpu -j 16 --target slided daemon_tests make_random_model > "$OUT/build-daemon.log" 2>&1 \
      || { grep -E 'error|Error' "$OUT/build-daemon.log" | head -30; exit 1; }
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
  extra)
    gen="Unix Makefiles"; command -v ninja >/dev/null && gen=Ninja
    [ -f build-gpu/CMakeCache.txt ] || cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1
    cmake --build build-gpu -j 16 --target slided slidectl sliding_bench make_random_model > "$OUT/build-extra.log" 2>&1 \
      || { grep -E 'error|Error' "$OUT/build-extra.log" | head -30; exit 1; }
    for w in 1 4; do run 150 build-gpu/bench/sliding_bench llama-3b 8 1024 3 $w cuda 1.0; done
    build-gpu/bench/make_random_model llama-1b /tmp/llama-1b > "$OUT/make_model.log" 2>&1
    rm -rf /tmp/slide-state /tmp/slide-out /tmp/slided.port
    build-gpu/server/slided --listen 127.0.0.1:0 --port-file /tmp/slided.port --metrics-listen off \
      --state-dir /tmp/slide-state 2> "$OUT/slided.log" &
    slided_pid=$!
    for _ in $(seq 100); do [ -s /tmp/slided.port ] && break; sleep 0.1; done
    addr="127.0.0.1:$(cat /tmp/slided.port)"
    printf 'model_dir: /tmp/llama-1b\ndataset: %s/deploy/demo/train.jsonl\noutput_dir: /tmp/slide-out\nsteps: 12\nbatch_size: 8\nseq_len: 1024\nsequence_mode: truncate\nlr: 0.00001\ndevice: cuda\ncheckpoint_every: 5\n' "$PWD" > /tmp/ckpt-job.yaml
    build-gpu/client/slidectl --addr "$addr" submit /tmp/ckpt-job.yaml --follow > "$OUT/ckpt_follow.log" 2>&1
    build-gpu/client/slidectl --addr "$addr" logs job-000001 > "$OUT/ckpt_logs.log" 2>&1
    grep -E 'checkpoint at|SUCCEEDED|FAILED' "$OUT/ckpt_logs.log" "$OUT/ckpt_follow.log" | head
    kill -TERM "$slided_pid"; wait "$slided_pid" ;;
esac
cat "$OUT/bench.jsonl" 2>/dev/null; tail -5 "$OUT/bench.err" 2>/dev/null; true
