// Throughput / memory benchmark of the sliding trainer on Llama-shaped random-init models.
// Usage: sliding_bench SHAPE BATCH [SEQ=1024] [STEPS=3] [WINDOW=2] [DEVICE=cuda] [MAX_GRAD_NORM=1.0]
//   MAX_GRAD_NORM 0 disables clipping (updates then overlap the backward): the pair measures what exact
//   clipping costs.
//   SHAPE: llama-1b | llama-3b | llama-8b | tiny, optionally @LAYERS (llama-8b@48), or a Hugging Face model directory
//   (its config.json gives the shape: Qwen2, Mistral, Qwen3, ...; the weights are random).
// SLIDE_PLAN_ONLY=1 prints the memory plan's totals and stops before allocating anything.
// SLIDE_TRACE_OUT=FILE writes the last step's timeline as Chrome trace JSON (Perfetto, chrome://tracing).
// SLIDE_NVME_STATE=moments|moments_and_master with SLIDE_NVME_DIR=DIR[:DIR...] keeps the optimizer state on the
// NVMe tier (SLIDE_NVME_CHUNK_MB, SLIDE_NVME_BUFFERS, SLIDE_NVME_QD, SLIDE_NVME_THREADS tune it); SLIDE_NVME_LAYERS=K
// puts only the last K layers' state there (default: every unit), the rest staying in host memory; K=0 lets the
// planner pick the fewest that fit this machine's memory (the JSON line's nvme_layers is its pick).
// SLIDE_RESIDENT=auto|N keeps the first N layers (auto: as many as the 24 GiB budget holds, the default on CUDA;
// 0 on the CPU) on the device with their optimizer state, updated there.
// SLIDE_DEVICE_UPDATE_SHARE=F (0..1) updates that share of the host layers on the GPU, their state streamed through
// a ring of device buffers (SLIDE_DEVICE_UPDATE_CHUNK elements each), beside the CPU updating the rest; default as
// slided's GPU jobs: kDefaultDeviceUpdateShare on CUDA without the NVMe tier, none beside parked layer inputs.
// SLIDE_CHECKPOINTS=auto|device|host: where layer inputs wait for the backward (auto: the planner's choice).
// SLIDE_HEAD_CHUNK_TOKENS=N: the LM head's chunk (plan and trainer; default slided's, LossOptions' 1024; the figures
// before it became the default ran 4096).
// Prints one JSON line: tokens/s, model TFLOPS (6*N*tokens + attention, no recompute), peak device bytes
// (caching allocator), peak host RSS, per-resource busy seconds per step, and the resource that bounds it.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/llama_shapes.h"
#include "engine/common/files.h"
#include "engine/kernels/fused_ops.h"
#include "engine/memory/host_array.h"
#include "engine/memory/memory_plan.h"
#include "engine/model/config.h"
#include "engine/runtime/device_info.h"
#include "engine/runtime/sliding_trainer.h"

using namespace slide;

int main(int argc, char** argv) {
  const auto main_start = std::chrono::steady_clock::now();
  if (argc < 3) {
    std::fprintf(stderr, "usage: sliding_bench SHAPE BATCH [SEQ] [STEPS] [WINDOW] [DEVICE]\n");
    return 2;
  }
  const std::string shape = argv[1];
  const int64_t batch = std::atoll(argv[2]);
  const int64_t seq = argc > 3 ? std::atoll(argv[3]) : 1024;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 3;
  const int64_t window = argc > 5 ? std::atoll(argv[5]) : 2;
  const std::string dev = argc > 6 ? argv[6] : "cuda";
  const double max_grad_norm = argc > 7 ? std::atof(argv[7]) : 1.0;
  const c10::Device device = dev == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);

  ModelConfig cfg;
  if (PathExists(shape + "/config.json")) {
    auto loaded = LoadHfConfig(shape);
    if (!loaded.ok()) {
      std::fprintf(stderr, "sliding_bench: %s\n", loaded.status().ToString().c_str());
      return 2;
    }
    cfg = loaded.value();
  } else {
    auto named = bench::LlamaShape(shape);
    if (!named.ok()) {
      std::fprintf(stderr, "sliding_bench: %s\n", named.status().ToString().c_str());
      return 2;
    }
    cfg = named.value();
  }
  // SLIDE_KERNELS=0 runs the unfused LibTorch ops instead of the fused CUDA kernels (the with/without comparison).
  if (const char* k = std::getenv("SLIDE_KERNELS"); k != nullptr && std::string(k) == "0")
    SetFusedKernelsEnabled(false);
  const char* trace_out = std::getenv("SLIDE_TRACE_OUT");
  auto env_int = [](const char* name, int64_t fallback) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::atoll(v) : fallback;
  };
  StateTierOptions nvme;
  if (const char* mode = std::getenv("SLIDE_NVME_STATE"); mode != nullptr && *mode != '\0') {
    auto parsed = ParseTierMode(mode);
    if (!parsed.ok()) {
      std::fprintf(stderr, "sliding_bench: %s\n", parsed.status().ToString().c_str());
      return 2;
    }
    nvme.mode = *parsed;
    const std::string dirs = std::getenv("SLIDE_NVME_DIR") != nullptr ? std::getenv("SLIDE_NVME_DIR") : "/var/tmp";
    for (size_t start = 0; start <= dirs.size();) {
      const size_t colon = std::min(dirs.find(':', start), dirs.size());
      if (colon > start) nvme.io.dirs.push_back(dirs.substr(start, colon - start));
      start = colon + 1;
    }
    nvme.chunk_bytes = static_cast<size_t>(env_int("SLIDE_NVME_CHUNK_MB", 32)) << 20;
    nvme.buffers = static_cast<int>(env_int("SLIDE_NVME_BUFFERS", 6));
    nvme.io.queue_depth = static_cast<unsigned>(env_int("SLIDE_NVME_QD", 32));
    nvme.io.io_threads = static_cast<int>(env_int("SLIDE_NVME_THREADS", 2));
    nvme.layers = env_int("SLIDE_NVME_LAYERS", -1);
  }
  PlanRequest plan_request;
  plan_request.model = cfg;
  plan_request.micro_batch = batch;
  plan_request.seq_len = seq;
  const int64_t head_chunk_tokens = env_int("SLIDE_HEAD_CHUNK_TOKENS", TrainerOptions{}.loss.chunk_tokens);
  plan_request.lm_head_chunk_tokens = head_chunk_tokens;
  plan_request.window = window;
  // SLIDE_CHECKPOINTS=host parks each layer's input in pinned host memory, so batches whose inputs would not fit
  // beside the window in the budget run (the critical batch under exact clipping); device keeps them there; auto
  // (the default, as slided's jobs) lets the planner choose within the 24 GiB budget: the device where they fit.
  const char* ckpt_env = std::getenv("SLIDE_CHECKPOINTS");
  const std::string ckpt = ckpt_env != nullptr && *ckpt_env != '\0' ? ckpt_env : "auto";
  if (ckpt != "auto" && ckpt != "device" && ckpt != "host") {
    std::fprintf(stderr, "sliding_bench: SLIDE_CHECKPOINTS must be auto, device or host, got '%s'\n", ckpt.c_str());
    return 2;
  }
  plan_request.checkpoints = ckpt == "host"     ? CheckpointPlacement::kHost
                             : ckpt == "device" ? CheckpointPlacement::kDevice
                                                : CheckpointPlacement::kAuto;
  plan_request.device_budget_bytes = int64_t(1) << 50;  // report, do not refuse
  plan_request.moments_on_nvme = nvme.mode != TierMode::kNone;
  plan_request.master_on_nvme = nvme.mode == TierMode::kMomentsAndMaster;
  plan_request.nvme_ring_bytes = StateTierRingBytes(nvme);
  plan_request.nvme_layers = nvme.layers;
  if (nvme.mode != TierMode::kNone && nvme.layers == 0) plan_request.host_budget_bytes = PhysicalHostBytes();
  // SLIDE_WEIGHTS_FIRST=auto|on|off (SlidingOptions::weights_first; default auto).
  const char* wf_env = std::getenv("SLIDE_WEIGHTS_FIRST");
  const std::string wf = wf_env != nullptr && *wf_env != '\0' ? wf_env : "auto";
  if (wf != "auto" && wf != "on" && wf != "off") {
    std::fprintf(stderr, "sliding_bench: SLIDE_WEIGHTS_FIRST must be auto, on or off, got '%s'\n", wf.c_str());
    return 2;
  }
  plan_request.weights_first = wf != "off" && max_grad_norm > 0;
  const int64_t gpu_budget = int64_t(24) << 30;  // an RTX 4090's memory: the allocator is capped there
  const char* resident_env = std::getenv("SLIDE_RESIDENT");
  const std::string resident_mode = resident_env != nullptr && *resident_env != '\0' ? resident_env
                                    : device.is_cuda()                               ? "auto"
                                                                                     : "0";
  // The share slided's GPU jobs stream unless SLIDE_DEVICE_UPDATE_SHARE says otherwise (then it is kept even beside
  // parked layer inputs).
  const char* share_env = std::getenv("SLIDE_DEVICE_UPDATE_SHARE");
  const bool share_given = share_env != nullptr && *share_env != '\0';
  double share = share_given                                        ? std::atof(share_env)
                 : device.is_cuda() && nvme.mode == TierMode::kNone ? kDefaultDeviceUpdateShare
                                                                    : 0.0;
  auto count_streamed_ring = [&] {  // the ring's device buffers are part of the plan (and of the room left for
    SlidingOptions ring;            // resident layers)
    ring.device_update_share = share;
    ring.device_update_chunk = env_int("SLIDE_DEVICE_UPDATE_CHUNK", ring.device_update_chunk);
    plan_request.streamed_ring_bytes = ring.DeviceUpdateRingBytes();
  };
  count_streamed_ring();
  if (plan_request.checkpoints == CheckpointPlacement::kAuto) {  // the planner's choice within the budget
    PlanRequest r = plan_request;
    r.device_budget_bytes = gpu_budget;
    auto chosen = PlanMemory(r);
    plan_request.checkpoints =
        chosen.ok() && chosen->checkpoints_on_host ? CheckpointPlacement::kHost : CheckpointPlacement::kDevice;
  }
  if (!share_given) {  // as a job's trainer: nothing streams beside parked layer inputs
    share = PlannedDeviceUpdateShare(share, plan_request.checkpoints == CheckpointPlacement::kHost);
    count_streamed_ring();
  }
  if (resident_mode == "auto") {
    PlanRequest r = plan_request;
    r.device_budget_bytes = gpu_budget;
    r.resident_layers = -1;
    auto fitted = PlanMemory(r);
    plan_request.resident_layers = fitted.ok() ? fitted->resident_layers : 0;
  } else {
    plan_request.resident_layers = std::atoll(resident_mode.c_str());
  }
  const auto planned = PlanMemory(plan_request);
  if (!planned.ok()) {
    std::fprintf(stderr, "sliding_bench: %s\n", planned.status().ToString().c_str());
    return 2;
  }
  const MemoryPlan& plan = planned.value();
  if (nvme.mode != TierMode::kNone) nvme.layers = plan.nvme_layers;  // the planner's pick for 0
  std::fprintf(stderr, "%s", plan.ToString().c_str());
  // SLIDE_PLAN_ONLY=1: the plan's totals as one JSON line, nothing allocated (run_gpu.sh largest sizes its ladder
  // with it; the plan was within 1 GiB of the measured host peak at 8B).
  if (const char* only = std::getenv("SLIDE_PLAN_ONLY"); only != nullptr && std::string(only) == "1") {
    std::printf(
        "{\"bench\": \"plan\", \"shape\": \"%s\", \"params\": %lld, \"resident_layers\": %lld, "
        "\"planned_gpu_bytes\": %lld, \"planned_host_bytes\": %lld, \"nvme_bytes\": %lld, \"nvme_layers\": %lld}\n",
        shape.c_str(), (long long)cfg.TotalParamCount(), (long long)plan.resident_layers, (long long)plan.device_total,
        (long long)plan.host_total, (long long)plan.nvme_bytes, (long long)plan.nvme_layers);
    return 0;
  }
  ModelParams init = bench::RandomLlamaParams(cfg);

  TrainerOptions o;
  o.adamw = {.lr = 0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  o.schedule = {.kind = LrScheduleKind::kConstant, .peak_lr = 1e-5, .warmup_steps = 0, .total_steps = 1000};
  o.max_grad_norm = max_grad_norm;
  o.compute_dtype = c10::kBFloat16;
  o.device = device;
  o.loss.chunk_tokens = head_chunk_tokens;
  SlidingOptions so{.train = o,
                    .window = window,
                    .checkpoints_on_host = plan.checkpoints_on_host,
                    .device_budget_bytes = gpu_budget,
                    .trace = trace_out != nullptr};
  so.nvme = nvme;
  so.resident_layers = plan.resident_layers;
  so.device_update_share = share;
  so.device_update_chunk = env_int("SLIDE_DEVICE_UPDATE_CHUNK", so.device_update_chunk);
  so.weights_first = wf == "on" ? WeightsFirst::kOn : wf == "off" ? WeightsFirst::kOff : WeightsFirst::kAuto;
  so.host_huge_pages = env_int("SLIDE_HUGE_PAGES", 1) != 0;  // 0: the host state on small pages (the comparison)
  // SLIDE_PHASE_MEMORY=1: each phase's peak device memory beside the plan's estimate of it (a second JSON line); the
  // allocator's peak then restarts at each phase, so peak_allocated is the largest phase's.
  so.measure_phase_memory = env_int("SLIDE_PHASE_MEMORY", 0) != 0;
  SlidingTrainer trainer(cfg, std::move(init), so);
  const double peak_after_setup = double(PeakResidentHostBytes());  // start-up's own peak, before any step
  if (trainer.tier() != nullptr) std::fprintf(stderr, "optimizer state: %s\n", trainer.tier()->description().c_str());
  // The tier's traffic from here on: steps + warm-up update passes, all drained at the end.
  const int64_t nvme_read0 = trainer.tier() ? trainer.tier()->store().bytes_read() : 0;
  const int64_t nvme_written0 = trainer.tier() ? trainer.tier()->store().bytes_written() : 0;

  auto batch_for = [&](int64_t s) {
    at::manual_seed(s);
    at::Tensor ids = at::randint(0, cfg.vocab_size, {batch, seq}, at::kLong);
    return std::vector<MicroBatch>{{ids, ShiftLabels(ids)}};
  };
  const auto bench_start = std::chrono::steady_clock::now();
  const double setup_s = std::chrono::duration<double>(bench_start - main_start).count();  // init, plan, trainer
  auto since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count();
  };
  // Warm-up: allocator, cuBLAS handles, first updates, then until the automatic weights-first choice has measured
  // both schedules (a job is past that after its first few steps; at most SLIDE_WARMUP_STEPS, default 6).
  const int64_t max_warmup = std::max<int64_t>(1, env_int("SLIDE_WARMUP_STEPS", 6));
  int64_t warmup = 0;
  // A step's error ends the benchmark with it (the trainer returns statuses, not exceptions).
  auto step = [&](int64_t seed) {
    StatusOr<StepStats> st = trainer.Step(batch_for(seed));
    if (!st.ok()) {
      std::fprintf(stderr, "sliding_bench: step failed: %s\n", st.status().ToString().c_str());
      std::exit(1);
    }
    return st.value();
  };
  do {
    step(warmup == 0 ? 0 : steps + warmup);  // seeds apart from the timed steps' 1..steps
    ++warmup;
  } while (warmup < max_warmup && !trainer.schedule_settled());
  std::fprintf(stderr, "sliding_bench: %lld warm-up steps done at %.1f s\n", (long long)warmup, since_start());
  const DeviceAllocatorStats after_first = ReadDeviceAllocatorStats();
  ResourceBusy sum;
  int weights_first_steps = 0;  // timed steps whose updates went weights first
  // Mean step time by the schedule of the updates a step ran (posted by the step before), counting a step only when
  // the step before it ran the same schedule (a switch spills into the next step): the automatic choice's two
  // measurements side by side.
  double schedule_s[2] = {0, 0};
  int schedule_n[2] = {0, 0};
  bool posted_first = trainer.last_busy().weights_first, ran_before = false, have_before = false;
  double loss = 0;
  PhaseMemory phases;  // the largest of each phase over the timed steps
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 1; s <= steps; ++s) {
    loss = step(s).loss;
    phases.Include(trainer.last_phase_memory());
    const auto& b = trainer.last_busy();
    sum.compute += b.compute, sum.h2d += b.h2d, sum.d2h += b.d2h, sum.cpu_update += b.cpu_update,
        sum.wait_update += b.wait_update, sum.nvme += b.nvme, sum.step += b.step, sum.device_update += b.device_update;
    sum.cpu_update_weights += b.cpu_update_weights;
    weights_first_steps += b.weights_first ? 1 : 0;
    const bool ran_first = posted_first;
    if (have_before && ran_before == ran_first) schedule_s[ran_first] += b.step, ++schedule_n[ran_first];
    ran_before = ran_first, have_before = true, posted_first = b.weights_first;
    // Progress on stderr: a run that stalls or crawls shows how far it got.
    std::fprintf(stderr, "sliding_bench: step %d of %d: %.3f s, ran %s updates, at %.1f s\n", s, steps, b.step,
                 ran_first ? "weights-first" : "whole", since_start());
  }
  if (Status st = trainer.SyncUpdates(); !st.ok()) {  // drain the last step's updates (and write-backs)
    std::fprintf(stderr, "sliding_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  if (trace_out != nullptr && !trainer.last_trace().empty()) {
    double origin = trainer.last_trace().front().t0;
    for (const auto& span : trainer.last_trace()) origin = std::min(origin, span.t0);
    if (Status st = WriteFileAtomic(trace_out, ToChromeTrace(trainer.last_trace(), origin)); !st.ok())
      std::fprintf(stderr, "sliding_bench: %s\n", st.ToString().c_str());
  }
  const DeviceAllocatorStats after_last = ReadDeviceAllocatorStats();
  const bool expandable = DeviceSegmentsExpandable();  // walks the allocator's segments: once
  // Steady state: each Step() includes waiting for the previous step's updates, so the mean Step() time is the
  // throughput of a long run. The wall time until the last step's updates drained is reported as well; with few
  // steps it adds a whole update to them (the figures before c400d60 were taken that way).
  const double wall_with_drain = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double secs = sum.step;
  const double tokens = double(batch) * seq * steps;
  const double n = double(cfg.TotalParamCount());
  // attention: 2 matmuls (QK^T, PV) of 2*S*S*d per layer forward, causal halves it, x3 for fwd+bwd.
  const double attn = 3.0 * 2.0 * 2.0 * cfg.num_layers * double(seq) * seq * cfg.q_dim() / 2.0 * batch * steps;
  const double tflops = (6.0 * n * tokens + attn) / secs / 1e12;
  const double peak_dev = double(after_last.peak_reserved_bytes);  // 0 without CUDA
  sum.compute /= steps, sum.h2d /= steps, sum.d2h /= steps, sum.cpu_update /= steps, sum.wait_update /= steps;
  sum.nvme /= steps;
  sum.device_update /= steps;
  sum.cpu_update_weights /= steps;
  // Bytes per update pass; the rate as `steps` passes over the timed wall time (the last step's drain included,
  // the last warm-up pass's tail overlapping the first timed step).
  const double nvme_read =
      trainer.tier() ? double(trainer.tier()->store().bytes_read() - nvme_read0) / (steps + warmup) : 0;
  const double nvme_written =
      trainer.tier() ? double(trainer.tier()->store().bytes_written() - nvme_written0) / (steps + warmup) : 0;
  sum.step = secs / steps;  // mean Step() time
  const char* bound = sum.Bound();
  std::printf(
      "{\"bench\": \"sliding\", \"shape\": \"%s\", \"params\": %.0f, \"layers\": %lld, \"hidden\": %lld, \"vocab\": "
      "%lld, "
      "\"batch\": %lld, \"seq\": %lld, \"head_chunk_tokens\": %lld, \"window\": %lld, \"checkpoints_on_host\": %s, "
      "\"resident_layers\": %lld, "
      "\"device_update_share\": %.2f, \"streamed_units\": %lld, "
      "\"max_grad_norm\": %.2f, "
      "\"steps\": %d, \"warmup_steps\": %lld, \"device\": \"%s\", "
      "\"tokens_per_s\": %.1f, "
      "\"model_tflops\": %.2f, \"step_s\": %.3f, \"wall_s_incl_last_update_drain\": %.3f, \"peak_gpu_bytes\": %.0f, "
      "\"planned_gpu_bytes\": %lld, "
      "\"planned_host_bytes\": %lld, \"peak_host_rss_bytes\": %.0f, \"peak_host_rss_after_setup_bytes\": %.0f, "
      "\"host_rss_bytes_after\": %.0f, "
      "\"busy_per_step_s\": {\"compute\": %.3f, \"h2d\": %.3f, \"d2h\": %.3f, \"cpu_update\": %.3f, \"wait_update\": "
      "%.3f, \"device_update\": %.3f, \"cpu_update_weights\": %.3f}, \"weights_first\": \"%s\", "
      "\"weights_first_steps\": %d, \"step_s_by_schedule\": {\"whole\": %.3f, \"whole_steps\": %d, "
      "\"weights_first\": %.3f, \"weights_first_steps\": %d}, \"ring_loads\": %lld, \"edge_ring_chunks\": %lld, "
      "\"host_huge_pages\": %s, \"thp_available\": %s, \"setup_s\": %.1f, \"fused_kernels\": %s, \"nvme_state\": "
      "\"%s\", \"nvme_layers\": %lld, \"nvme\": {\"wait_per_step_s\": %.3f, "
      "\"read_bytes_per_update\": "
      "%.0f, "
      "\"written_bytes_per_update\": %.0f, \"read_gb_s\": %.3f, \"write_gb_s\": %.3f, \"disk_bytes\": %lld, "
      "\"ring_bytes\": %lld, \"backend\": \"%s\"}, "
      "\"bounded_by\": \"%s\", \"overlap_ratio\": %.3f, \"loss\": %.4f, \"gpu_budget_bytes\": %lld, \"allocator\": "
      "{\"reserved_after_step1\": "
      "%lld, \"reserved_after_last\": %lld, \"device_allocs_after_step1\": %lld, \"device_allocs_after_last\": "
      "%lld, \"peak_allocated\": %lld, \"alloc_retries\": %lld, \"ooms\": %lld, \"expandable_segments\": %s}, "
      "\"note\": \"device compute/h2d/d2h "
      "busy from CUDA "
      "events; cpu_update timed inside update tasks; wait_update = engine thread blocked on updates; overlap_ratio = "
      "step / busiest resource (1 = all else hidden)\"}\n",
      shape.c_str(), n, (long long)cfg.num_layers, (long long)cfg.hidden_size, (long long)cfg.vocab_size,
      (long long)batch, (long long)seq, (long long)head_chunk_tokens, (long long)window,
      plan.checkpoints_on_host ? "true" : "false", (long long)plan.resident_layers, so.device_update_share,
      (long long)trainer.streamed_units(), max_grad_norm, steps, (long long)warmup, dev.c_str(), tokens / secs, tflops,
      secs / steps, wall_with_drain, peak_dev, (long long)plan.device_total, (long long)plan.host_total,
      double(PeakResidentHostBytes()), peak_after_setup, double(ResidentHostBytes()), sum.compute, sum.h2d, sum.d2h,
      sum.cpu_update, sum.wait_update, sum.device_update, sum.cpu_update_weights, wf.c_str(), weights_first_steps,
      schedule_n[0] ? schedule_s[0] / schedule_n[0] : 0.0, schedule_n[0],
      schedule_n[1] ? schedule_s[1] / schedule_n[1] : 0.0, schedule_n[1], (long long)trainer.ring_loads(),
      (long long)trainer.edge_ring_chunks(), so.host_huge_pages ? "true" : "false",
      HostHugePagesAvailable() ? "true" : "false", setup_s, FusedKernelsEnabled() ? "true" : "false",
      TierModeName(nvme.mode), (long long)nvme.layers, sum.nvme, nvme_read, nvme_written,
      nvme_read * steps / wall_with_drain / 1e9, nvme_written * steps / wall_with_drain / 1e9,
      trainer.tier() ? (long long)trainer.tier()->disk_bytes() : 0LL,
      trainer.tier() ? (long long)trainer.tier()->ring_bytes() : 0LL,
      trainer.tier() ? trainer.tier()->store().backend_name().c_str() : "", bound, sum.OverlapRatio(), loss,
      (long long)gpu_budget, (long long)after_first.reserved_bytes, (long long)after_last.reserved_bytes,
      (long long)after_first.device_allocations, (long long)after_last.device_allocations,
      (long long)after_last.peak_allocated_bytes, (long long)after_last.alloc_retries, (long long)after_last.ooms,
      expandable ? "true" : "false");
  if (so.measure_phase_memory && device.is_cuda()) {
    // Beside the plan's estimate of each phase (MemoryPlan::PlannedPhasePeaks; until ee3c785 the plan had no forward
    // phase, so "forward" was its inputs alone).
    const MemoryPlan::PhasePeaks planned = plan.PlannedPhasePeaks();
    std::printf(
        "{\"bench\": \"phase_memory\", \"shape\": \"%s\", \"batch\": %lld, \"seq\": %lld, \"resident_layers\": %lld, "
        "\"checkpoints_on_host\": %s, \"expandable_segments\": %s, \"measured\": {\"step_start\": %lld, \"forward\": "
        "%lld, \"head\": %lld, \"layers\": %lld, \"embedding\": %lld, \"update\": %lld}, \"planned\": {\"step_start\": "
        "%lld, \"forward\": %lld, \"head\": %lld, \"layers\": %lld, \"embedding\": %lld}, "
        "\"planned_total_less_reserve\": %lld, \"peak_reserved\": %lld}\n",
        shape.c_str(), (long long)batch, (long long)seq, (long long)plan.resident_layers,
        plan.checkpoints_on_host ? "true" : "false", expandable ? "true" : "false", (long long)phases.step_start,
        (long long)phases.forward, (long long)phases.head, (long long)phases.layers, (long long)phases.embedding,
        (long long)phases.update, (long long)planned.step_start, (long long)planned.forward, (long long)planned.head,
        (long long)planned.layers, (long long)planned.embedding, (long long)(plan.device_total - plan.reserved_bytes),
        (long long)after_last.peak_reserved_bytes);
  }
  return 0;
}
