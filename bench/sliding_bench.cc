// Throughput / memory benchmark of the sliding trainer on Llama-shaped random-init models, resolved exactly as
// slided resolves a job (ResolveTrainer within the GPU budget: window, layer-input placement, resident layers, the
// streamed share, the NVMe tier). Prints one JSON line (two with --phase-memory): tokens/s, model TFLOPS
// (6*N*tokens + attention, no recompute), peak device bytes (caching allocator), peak host RSS, per-resource busy
// seconds per step, and the resource that bounds it.
//   sliding_bench SHAPE BATCH [--seq 1024] [--steps 3] [--checkpoints host] [--weights-first on] ...  (--help)
// SHAPE: llama-1b | llama-3b | llama-8b | tiny, optionally @LAYERS (llama-8b@48), or a Hugging Face model directory
// (its config.json gives the shape: Qwen2, Mistral, Qwen3, ...; the weights are random).
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/llama_shapes.h"
#include "engine/common/files.h"
#include "engine/kernels/fused_ops.h"
#include "engine/memory/host_array.h"
#include "engine/memory/memory_plan.h"
#include "engine/model/config.h"
#include "engine/runtime/adapter_store.h"
#include "engine/runtime/device_info.h"
#include "engine/runtime/sliding_trainer.h"
#include "engine/runtime/trainer_resolver.h"

using namespace slide;
using Json = nlohmann::ordered_json;

namespace {

struct Flags {
  std::string shape;
  int64_t batch = 0, seq = 1024, window = 2, head_chunk_tokens = TrainerOptions{}.loss.chunk_tokens;
  int64_t micro_batch = 0;  // 0: the whole batch at once; else the step accumulates batch / micro_batch of these
  int steps = 3, warmup_steps = 6;
  std::string device = "cuda";
  double max_grad_norm = 1.0;
  double gpu_budget_gib = 24;  // an RTX 4090's memory: the plan and the caching allocator are held to it
  std::string checkpoints = "auto", weights_first = "auto", resident = "auto";
  double device_update_share = -1;  // < 0: as slided's GPU jobs
  int64_t device_update_chunk = SlidingOptions{}.device_update_chunk;
  std::string nvme_state = "none";
  std::string optimizer = "adamw";
  std::vector<std::string> nvme_dirs = {"/var/tmp"};
  int64_t nvme_chunk_mb = 32, nvme_layers = -1;
  int nvme_buffers = 6, nvme_queue_depth = 32, nvme_threads = 2;
  bool huge_pages = true, phase_memory = false, plan_only = false, kernels = true, stream_in_weights_first = false;
  std::string trace_out;
  // LoRA (adapter mode) when lora_r > 0: alpha 0 means 2r; targets comma-separated (PEFT's module names).
  int64_t lora_r = 0;
  double lora_alpha = 0, lora_dropout = 0;
  bool qlora = false;  // the base's layers in NF4 (double quantised), drawn and quantised one layer at a time
  std::string lora_targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "sliding_bench: %s\n", what.c_str());
  return 2;
}

StatusOr<ModelConfig> Shape(const std::string& shape) {
  if (PathExists(shape + "/config.json")) return LoadHfConfig(shape);
  return bench::LlamaShape(shape);
}

}  // namespace

int main(int argc, char** argv) {
  const auto main_start = std::chrono::steady_clock::now();
  Flags f;
  CLI::App app{"sliding_bench: the sliding trainer's throughput and memory on a random-init model", "sliding_bench"};
  app.add_option("shape", f.shape, "llama-1b | llama-3b | llama-8b | tiny [@LAYERS], or a model directory")->required();
  app.add_option("batch", f.batch, "sequences a step")->required()->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro-batch", f.micro_batch, "sequences a micro-batch (a divisor of the batch; 0: the batch)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--seq", f.seq, "tokens a sequence")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", f.steps, "timed steps, after the warm-up")->check(CLI::Range(1, 100000));
  app.add_option("--warmup-steps", f.warmup_steps,
                 "at most this many warm-up steps: until the automatic weights-first choice has measured both "
                 "schedules")
      ->check(CLI::Range(1, 1000));
  app.add_option("--window", f.window, "layer slots on the device (0: the planner's choice)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--device", f.device, "cuda or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--max-grad-norm", f.max_grad_norm,
                 "exact global-norm clipping; 0 turns it off (updates then overlap the backward)");
  app.add_option("--gpu-budget-gib", f.gpu_budget_gib, "the device budget the job is planned and held to");
  app.add_option("--checkpoints", f.checkpoints, "where layer inputs wait for the backward")
      ->check(CLI::IsMember({"auto", "device", "host"}));
  app.add_flag("--stream-in-weights-first,!--no-stream-in-weights-first", f.stream_in_weights_first,
               "streamed layers stream in weights-first steps too (default off)");
  app.add_option("--weights-first", f.weights_first, "the weights-first schedule")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--resident", f.resident, "layers kept on the device: auto (as many as fit) or a count");
  app.add_option("--device-update-share", f.device_update_share,
                 "share of the host layers updated on the GPU (default: slided's; none beside parked inputs)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--device-update-chunk", f.device_update_chunk, "elements a streamed-update ring buffer")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  app.add_option("--head-chunk-tokens", f.head_chunk_tokens, "the LM head's chunk")->check(CLI::Range(1, 1 << 24));
  app.add_option("--optimizer", f.optimizer, "AdamW's moments: fp32 or blockwise 8-bit")
      ->check(CLI::IsMember({"adamw", "adamw_8bit"}));
  app.add_option("--nvme-state", f.nvme_state, "optimizer state on the NVMe tier")
      ->check(CLI::IsMember({"none", "moments", "moments_and_master"}));
  app.add_option("--nvme-dir", f.nvme_dirs, "the tier's directories (repeat for several disks)");
  app.add_option("--nvme-layers", f.nvme_layers,
                 "the last K layers on the tier (-1: every unit; 0: the fewest that "
                 "fit this machine's memory)");
  app.add_option("--nvme-chunk-mb", f.nvme_chunk_mb, "the tier's chunk")->check(CLI::Range(1, 4096));
  app.add_option("--nvme-buffers", f.nvme_buffers, "the tier's ring buffers")->check(CLI::Range(2, 1024));
  app.add_option("--nvme-queue-depth", f.nvme_queue_depth, "I/O requests in flight a thread")
      ->check(CLI::Range(1, 4096));
  app.add_option("--nvme-threads", f.nvme_threads, "I/O threads")->check(CLI::Range(1, 64));
  app.add_flag("--huge-pages,!--no-huge-pages", f.huge_pages, "host state on transparent huge pages (default on)");
  app.add_flag("--kernels,!--no-kernels", f.kernels, "the fused CUDA kernels (off: LibTorch's ops)");
  app.add_flag("--phase-memory", f.phase_memory, "each phase's peak device memory beside the plan (second line)");
  app.add_flag("--plan-only", f.plan_only, "print the plan's totals as one JSON line; allocate nothing");
  app.add_option("--trace-out", f.trace_out, "the last step's timeline as Chrome trace JSON");
  app.add_option("--lora-r", f.lora_r, "LoRA rank: train adapters over a frozen bf16 base (0: full fine-tuning)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--lora-alpha", f.lora_alpha, "LoRA alpha (0: twice the rank)");
  app.add_option("--lora-dropout", f.lora_dropout, "LoRA dropout")->check(CLI::Range(0.0, 0.99));
  app.add_flag("--qlora", f.qlora, "QLoRA: the frozen base's layers in NF4 (needs --lora-r)");
  app.add_option("--lora-targets", f.lora_targets, "LoRA target modules, comma-separated");
  CLI11_PARSE(app, argc, argv);

  auto shaped = Shape(f.shape);
  if (!shaped.ok()) return Fail(shaped.status().ToString());
  const ModelConfig cfg = shaped.value();
  SetFusedKernelsEnabled(f.kernels);
  const bool cuda = f.device == "cuda";
  const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);

  // What is asked of the trainer, as a job asks it (training_job.cc ResolveJobTrainer), and the budgets.
  SlidingOptions asked;
  asked.train.adamw = {.lr = 0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  asked.train.schedule = {.kind = LrScheduleKind::kConstant, .peak_lr = 1e-5, .warmup_steps = 0, .total_steps = 1000};
  asked.train.max_grad_norm = f.max_grad_norm;
  asked.train.optimizer = f.optimizer == "adamw_8bit" ? OptimizerKind::kAdamW8bit : OptimizerKind::kAdamW;
  asked.train.compute_dtype = c10::kBFloat16;
  asked.train.device = device;
  asked.train.loss.chunk_tokens = f.head_chunk_tokens;
  asked.trace = !f.trace_out.empty();
  auto mode = ParseTierMode(f.nvme_state);
  if (!mode.ok()) return Fail(mode.status().ToString());
  asked.nvme.mode = *mode;
  asked.nvme.io.dirs = f.nvme_dirs;
  asked.nvme.chunk_bytes = static_cast<size_t>(f.nvme_chunk_mb) << 20;
  asked.nvme.buffers = f.nvme_buffers;
  asked.nvme.io.queue_depth = static_cast<unsigned>(f.nvme_queue_depth);
  asked.nvme.io.io_threads = f.nvme_threads;
  asked.nvme.layers = f.nvme_layers;
  asked.device_update_chunk = f.device_update_chunk;
  asked.stream_in_weights_first = f.stream_in_weights_first;
  asked.weights_first = f.weights_first == "on"    ? WeightsFirst::kOn
                        : f.weights_first == "off" ? WeightsFirst::kOff
                                                   : WeightsFirst::kAuto;
  asked.host_huge_pages = f.huge_pages;
  // The allocator's peak restarts at each phase: peak_allocated is then the largest phase's.
  asked.measure_phase_memory = f.phase_memory;
  if (f.lora_r > 0) {
    LoraOptions lora;
    lora.r = f.lora_r;
    lora.alpha = f.lora_alpha > 0 ? f.lora_alpha : 2.0 * double(f.lora_r);
    lora.dropout = f.lora_dropout;
    lora.target_modules.clear();
    for (size_t b = 0; b <= f.lora_targets.size();) {
      const size_t e = std::min(f.lora_targets.find(',', b), f.lora_targets.size());
      if (e > b) lora.target_modules.push_back(f.lora_targets.substr(b, e - b));
      b = e + 1;
    }
    if (Status st = ValidateLoraOptions(lora, cfg); !st.ok()) return Fail(st.ToString());
    asked.adapter = lora;
    if (f.qlora) asked.nf4_base = Nf4BaseOptions{};
    asked.weights_first = WeightsFirst::kOff;
  }
  asked.device_update_share = f.device_update_share >= 0 ? f.device_update_share : DefaultDeviceUpdateShare(asked);
  PlanRequest budget;
  const int64_t micro = f.micro_batch > 0 ? f.micro_batch : f.batch;
  if (f.batch % micro != 0) return Fail("--micro-batch must divide the batch");
  budget.micro_batch = micro;
  budget.grad_accum = f.batch / micro;
  budget.seq_len = f.seq;
  budget.window = f.window;
  if (f.lora_r > 0 && app.count("--window") == 0) budget.window = 0;  // slots hold the frozen base: the widest fit
  budget.checkpoints = f.checkpoints == "host"     ? CheckpointPlacement::kHost
                       : f.checkpoints == "device" ? CheckpointPlacement::kDevice
                                                   : CheckpointPlacement::kAuto;
  budget.device_budget_bytes = static_cast<int64_t>(f.gpu_budget_gib * double(int64_t(1) << 30));
  if (!cuda) budget.device_reserved_bytes = 0;
  if (asked.nvme.mode != TierMode::kNone && f.nvme_layers == 0) budget.host_budget_bytes = PhysicalHostBytes();
  if (f.resident == "auto") {
    budget.resident_layers = cuda ? -1 : 0;
  } else {
    try {
      budget.resident_layers = std::stoll(f.resident);
    } catch (const std::exception&) {
      return Fail("--resident must be auto or a layer count, got '" + f.resident + "'");
    }
  }
  auto resolved = ResolveTrainer(cfg, asked, budget);
  if (!resolved.ok()) return Fail(resolved.status().ToString());
  const MemoryPlan& plan = resolved->plan;
  const SlidingOptions& so = resolved->options;
  std::fprintf(stderr, "%s", plan.ToString().c_str());
  if (f.plan_only) {
    std::printf("%s\n", Json{{"bench", "plan"},
                             {"shape", f.shape},
                             {"params", cfg.TotalParamCount()},
                             {"resident_layers", plan.resident_layers},
                             {"planned_gpu_bytes", plan.device_total},
                             {"planned_host_bytes", plan.host_total},
                             {"nvme_bytes", plan.nvme_bytes},
                             {"nvme_layers", plan.nvme_layers}}
                            .dump()
                            .c_str());
    return 0;
  }

  if (f.qlora && f.lora_r <= 0) return Fail("--qlora needs --lora-r");
  ModelParams base;
  std::vector<Nf4Unit> nf4_layers;
  const c10::ScalarType base_dtype = asked.adapter ? asked.train.compute_dtype : at::kFloat;
  if (f.qlora) {  // the layers drawn and quantised one at a time: the base is never whole in bf16
    base.layout = BuildModelLayout(cfg);
    for (size_t u = 0; u < base.layout.units.size(); ++u) {
      // Decoder layers are drawn in fp32, which they are quantised from (no bf16 copy and rounding in between).
      const bool layer = base.layout.units[u].kind == UnitKind::kDecoderLayer;
      at::Tensor unit = bench::RandomLlamaUnit(base.layout.units[u], u, layer ? at::kFloat : base_dtype);
      if (!layer) {
        base.units.push_back(std::move(unit));
        continue;
      }
      base.units.emplace_back();
      nf4_layers.push_back(QuantizeNf4Unit(base.layout.units[u], unit, /*double_quant=*/true, base_dtype,
                                           [](int64_t n, c10::ScalarType t) { return at::empty({n}, t); }));
    }
  } else {
    base = bench::RandomLlamaParams(cfg, base_dtype);
  }
  auto made = SlidingTrainer::Create(cfg, std::move(base), *resolved, std::move(nf4_layers));
  if (!made.ok()) return Fail(made.status().ToString());
  SlidingTrainer& trainer = **made;
  const double peak_after_setup = double(PeakResidentHostBytes());  // start-up's own peak, before any step
  const StateTier* tier = trainer.tier();
  if (tier != nullptr) std::fprintf(stderr, "optimizer state: %s\n", tier->description().c_str());
  // The tier's traffic from here on: steps + warm-up update passes, all drained at the end.
  const int64_t nvme_read0 = tier ? tier->store().bytes_read() : 0;
  const int64_t nvme_written0 = tier ? tier->store().bytes_written() : 0;

  auto batch_for = [&](int64_t s) {
    at::manual_seed(s);
    std::vector<MicroBatch> mbs;
    for (int64_t m = 0; m < f.batch / micro; ++m) {
      at::Tensor ids = at::randint(0, cfg.vocab_size, {micro, f.seq}, at::kLong);
      mbs.push_back({ids, ShiftLabels(ids)});
    }
    return mbs;
  };
  const auto bench_start = std::chrono::steady_clock::now();
  const double setup_s = std::chrono::duration<double>(bench_start - main_start).count();  // init, plan, trainer
  auto since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count();
  };
  auto step = [&](int64_t seed) {  // a step's error ends the benchmark with it
    StatusOr<StepStats> st = trainer.Step(batch_for(seed));
    if (!st.ok()) {
      std::fprintf(stderr, "sliding_bench: step failed: %s\n", st.status().ToString().c_str());
      std::exit(1);
    }
    return st.value();
  };
  // Warm-up: allocator, cuBLAS handles, first updates, then until the automatic weights-first choice has measured
  // both schedules (a job is past that after its first few steps).
  int64_t warmup = 0;
  do {
    step(warmup == 0 ? 0 : f.steps + warmup);  // seeds apart from the timed steps' 1..steps
    ++warmup;
  } while (warmup < f.warmup_steps && !trainer.schedule_settled());
  std::fprintf(stderr, "sliding_bench: %lld warm-up steps done at %.1f s\n", (long long)warmup, since_start());
  const DeviceAllocatorStats after_first = ReadDeviceAllocatorStats();
  ResourceBusy sum;
  int weights_first_steps = 0;  // timed steps whose updates went weights first
  // Mean step time by the schedule of the updates a step ran (posted by the step before), counting a step only when
  // the step before it ran the same schedule (a switch spills into the next step).
  double schedule_s[2] = {0, 0};
  int schedule_n[2] = {0, 0};
  bool posted_first = trainer.last_busy().weights_first, ran_before = false, have_before = false;
  double loss = 0;
  PhaseMemory phases;  // the largest of each phase over the timed steps
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 1; s <= f.steps; ++s) {
    loss = step(s).loss;
    phases.Include(trainer.last_phase_memory());
    const ResourceBusy& b = trainer.last_busy();
    sum.compute += b.compute, sum.h2d += b.h2d, sum.d2h += b.d2h, sum.cpu_update += b.cpu_update;
    sum.wait_update += b.wait_update, sum.nvme += b.nvme, sum.step += b.step, sum.device_update += b.device_update;
    sum.cpu_update_weights += b.cpu_update_weights;
    weights_first_steps += b.weights_first ? 1 : 0;
    const bool ran_first = posted_first;
    if (have_before && ran_before == ran_first) schedule_s[ran_first] += b.step, ++schedule_n[ran_first];
    ran_before = ran_first, have_before = true, posted_first = b.weights_first;
    std::fprintf(stderr, "sliding_bench: step %d of %d: %.3f s, ran %s updates, at %.1f s\n", s, f.steps, b.step,
                 ran_first ? "weights-first" : "whole", since_start());
  }
  if (Status st = trainer.SyncUpdates(); !st.ok()) return Fail(st.ToString());  // the last updates, written back
  if (!f.trace_out.empty() && !trainer.last_trace().empty()) {
    double origin = trainer.last_trace().front().t0;
    for (const auto& span : trainer.last_trace()) origin = std::min(origin, span.t0);
    if (Status st = WriteFileAtomic(f.trace_out, ToChromeTrace(trainer.last_trace(), origin)); !st.ok())
      std::fprintf(stderr, "sliding_bench: %s\n", st.ToString().c_str());
  }
  const DeviceAllocatorStats after_last = ReadDeviceAllocatorStats();
  // Steady state: each Step() includes waiting for the previous step's updates, so the mean Step() time is the
  // throughput of a long run; the wall time until the last step's updates drained is reported beside it.
  const double wall_with_drain = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double secs = sum.step, steps = f.steps;
  const double tokens = double(f.batch) * double(f.seq) * steps;
  const double n = double(cfg.TotalParamCount());
  const double trainable = trainer.adapters() ? double(trainer.adapters()->layout().TrainableParams()) : n;
  // Model FLOPs a token: 6N for full fine-tuning (forward 2N, backward 4N); a frozen base skips its weight gradients
  // (forward 2N, input gradients 2N) and the adapters add their own 6 per trainable parameter.
  const double flops_per_token = trainer.adapters() ? 4.0 * n + 6.0 * trainable : 6.0 * n;
  // attention: 2 matmuls (QK^T, PV) of 2*S*S*d per layer forward, causal halves it, x3 for fwd+bwd.
  const double attn =
      3.0 * 2.0 * 2.0 * cfg.num_layers * double(f.seq) * double(f.seq) * cfg.q_dim() / 2.0 * double(f.batch) * steps;
  for (double* v : {&sum.compute, &sum.h2d, &sum.d2h, &sum.cpu_update, &sum.wait_update, &sum.nvme, &sum.device_update,
                    &sum.cpu_update_weights})
    *v /= steps;
  sum.step = secs / steps;
  // Bytes per update pass; the rate as `steps` passes over the timed wall time.
  const double passes = steps + double(warmup);
  const double nvme_read = tier ? double(tier->store().bytes_read() - nvme_read0) / passes : 0;
  const double nvme_written = tier ? double(tier->store().bytes_written() - nvme_written0) / passes : 0;
  Json line = {
      {"bench", "sliding"},
      {"shape", f.shape},
      {"params", n},
      {"layers", cfg.num_layers},
      {"hidden", cfg.hidden_size},
      {"vocab", cfg.vocab_size},
      {"batch", f.batch},
      {"micro_batch", micro},
      {"seq", f.seq},
      {"head_chunk_tokens", f.head_chunk_tokens},
      {"window", so.window},
      {"checkpoints_on_host", plan.checkpoints_on_host},
      {"resident_layers", plan.resident_layers},
      {"device_update_share", so.device_update_share},
      {"stream_in_weights_first", so.stream_in_weights_first},
      {"streamed_units", trainer.streamed_units()},
      {"max_grad_norm", f.max_grad_norm},
      {"optimizer", f.optimizer},
      {"steps", f.steps},
      {"warmup_steps", warmup},
      {"device", f.device},
      {"tokens_per_s", tokens / secs},
      {"model_tflops", (flops_per_token * tokens + attn) / secs / 1e12},
      {"mode", trainer.adapters() ? (f.qlora ? "qlora" : "lora") : "full"},
      {"lora_r", f.lora_r},
      {"trainable_params", trainable},
      {"step_s", secs / steps},
      {"wall_s_incl_last_update_drain", wall_with_drain},
      {"peak_gpu_bytes", after_last.peak_reserved_bytes},
      {"planned_gpu_bytes", plan.device_total},
      {"planned_host_bytes", plan.host_total},
      {"peak_host_rss_bytes", PeakResidentHostBytes()},
      {"peak_host_rss_after_setup_bytes", peak_after_setup},
      {"host_rss_bytes_after", ResidentHostBytes()},
      {"busy_per_step_s",
       {{"compute", sum.compute},
        {"h2d", sum.h2d},
        {"d2h", sum.d2h},
        {"cpu_update", sum.cpu_update},
        {"wait_update", sum.wait_update},
        {"device_update", sum.device_update},
        {"cpu_update_weights", sum.cpu_update_weights}}},
      {"weights_first", f.weights_first},
      {"weights_first_steps", weights_first_steps},
      {"step_s_by_schedule",
       {{"whole", schedule_n[0] ? schedule_s[0] / schedule_n[0] : 0.0},
        {"whole_steps", schedule_n[0]},
        {"weights_first", schedule_n[1] ? schedule_s[1] / schedule_n[1] : 0.0},
        {"weights_first_steps", schedule_n[1]}}},
      {"ring_loads", trainer.ring_loads()},
      {"edge_ring_chunks", trainer.edge_ring_chunks()},
      {"host_huge_pages", so.host_huge_pages},
      {"thp_available", HostHugePagesAvailable()},
      {"setup_s", setup_s},
      {"fused_kernels", FusedKernelsEnabled()},
      {"nvme_state", TierModeName(so.nvme.mode)},
      {"nvme_layers", so.nvme.mode != TierMode::kNone ? plan.nvme_layers : 0},
      {"nvme",
       {{"wait_per_step_s", sum.nvme},
        {"read_bytes_per_update", nvme_read},
        {"written_bytes_per_update", nvme_written},
        {"read_gb_s", nvme_read * steps / wall_with_drain / 1e9},
        {"write_gb_s", nvme_written * steps / wall_with_drain / 1e9},
        {"disk_bytes", tier ? tier->disk_bytes() : 0},
        {"ring_bytes", tier ? tier->ring_bytes() : 0},
        {"backend", tier ? tier->store().backend_name() : ""}}},
      {"bounded_by", sum.Bound()},
      {"overlap_ratio", sum.OverlapRatio()},
      {"loss", loss},
      {"gpu_budget_bytes", so.device_budget_bytes},
      {"allocator",
       {{"reserved_after_step1", after_first.reserved_bytes},
        {"reserved_after_last", after_last.reserved_bytes},
        {"device_allocs_after_step1", after_first.device_allocations},
        {"device_allocs_after_last", after_last.device_allocations},
        {"peak_allocated", after_last.peak_allocated_bytes},
        {"alloc_retries", after_last.alloc_retries},
        {"ooms", after_last.ooms},
        {"expandable_segments", DeviceSegmentsExpandable()}}},
      {"note",
       "device compute/h2d/d2h busy from CUDA events; cpu_update timed inside update tasks; wait_update = engine "
       "thread blocked on updates; overlap_ratio = step / busiest resource (1 = all else hidden)"}};
  std::printf("%s\n", line.dump().c_str());
  if (f.phase_memory && cuda) {  // beside the plan's estimate of each phase (MemoryPlan::PlannedPhasePeaks)
    const MemoryPlan::PhasePeaks planned = plan.PlannedPhasePeaks();
    Json memory = {{"bench", "phase_memory"},
                   {"shape", f.shape},
                   {"batch", f.batch},
                   {"seq", f.seq},
                   {"resident_layers", plan.resident_layers},
                   {"checkpoints_on_host", plan.checkpoints_on_host},
                   {"expandable_segments", DeviceSegmentsExpandable()},
                   {"measured",
                    {{"step_start", phases.step_start},
                     {"forward", phases.forward},
                     {"head", phases.head},
                     {"layers", phases.layers},
                     {"embedding", phases.embedding},
                     {"update", phases.update}}},
                   {"planned",
                    {{"step_start", planned.step_start},
                     {"forward", planned.forward},
                     {"head", planned.head},
                     {"layers", planned.layers},
                     {"embedding", planned.embedding}}},
                   {"planned_total_less_reserve", plan.device_total - plan.reserved_bytes},
                   {"peak_reserved", after_last.peak_reserved_bytes}};
    std::printf("%s\n", memory.dump().c_str());
  }
  return 0;
}
