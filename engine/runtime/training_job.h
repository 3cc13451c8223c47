// A fine-tuning job at the engine boundary: plain structs in, events out, no gRPC. RunTrainingJob loads the
// Hugging Face model directory, tokenizer and JSONL dataset, plans memory, trains with the sliding-window
// trainer, evaluates on the held-out split and exports a Hugging Face directory. Bad input fails this job
// with a precise status; cancellation is honoured at step boundaries.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/data/dataset.h"
#include "engine/io/state_tier.h"
#include "engine/memory/checkpoint_placement.h"
#include "engine/model/config.h"
#include "engine/model/lora_options.h"
#include "engine/optim/lr_schedule.h"
#include "engine/optim/optimizer_kind.h"

namespace slide {

enum class DeviceChoice { kAuto, kCpu, kCuda };         // auto: CUDA when present
enum class ComputeDtypeChoice { kAuto, kBf16, kFp32 };  // auto: bf16 on CUDA, fp32 on the CPU
enum class ExportDtype { kBf16, kFp32 };                // the dtype of the exported weights
// none: full fine-tuning; lora: adapters over the frozen base in the compute dtype; qlora: the same over a base
// whose decoder layers are kept in NF4 (double quantised), quantised layer by layer as the weights are read.
enum class AdapterMethod { kNone, kLora, kQLora };
inline bool UsesAdapter(AdapterMethod m) { return m != AdapterMethod::kNone; }
const char* AdapterMethodName(AdapterMethod m);  // none | lora | qlora
enum class AdapterExport { kAdapter, kMerged };  // PEFT's adapter files, or the merged model (HF format)

struct TrainingJobSpec {
  std::string model_dir;     // Hugging Face directory: config.json, safetensors, tokenizer.json
  std::string dataset_path;  // JSONL
  std::string output_dir;    // the export goes here
  // Hyperparameters.
  int64_t steps = 0;  // optimizer steps; 0 = derive from epochs
  int64_t epochs = 1;
  int64_t batch_size = 8;        // sequences per optimizer step
  int64_t micro_batch_size = 0;  // 0 = batch_size (no accumulation)
  int64_t seq_len = 512;
  bool allow_seq_len_beyond_model = false;  // seq_len above the model's max_position_embeddings only when true
  double lr = 1e-5;
  LrScheduleKind lr_schedule = LrScheduleKind::kCosine;
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.95, adam_eps = 1e-8;
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // adamw_8bit: blockwise 8-bit moments (host-held state only)
  uint64_t seed = 0;
  // Data.
  DatasetFormat dataset_format = DatasetFormat::kAuto;
  ChatTemplateChoice chat_template = ChatTemplateChoice::kAuto;  // messages lines: the model's own template
  TrainOn train_on = TrainOn::kAssistant;
  SequenceMode sequence_mode = SequenceMode::kPack;
  BadLinePolicy bad_lines = BadLinePolicy::kFail;
  double eval_fraction = 0.0;
  // Engine.
  DeviceChoice device = DeviceChoice::kAuto;
  ComputeDtypeChoice compute_dtype = ComputeDtypeChoice::kAuto;
  int64_t gpu_budget_bytes = 0;  // 0 = JobEnvironment's default
  int64_t window = 0;            // 0 = the planner chooses
  CheckpointPlacement activation_placement = CheckpointPlacement::kAuto;
  int64_t log_every = 1;
  // Optimizer state on local disk through the NVMe tier.
  TierMode nvme_state = TierMode::kNone;
  int64_t nvme_layers = -1;  // with nvme_state: only the last N layers' state on the tier; 0: as few as fit; -1: all
  ExportDtype export_dtype = ExportDtype::kBf16;
  int64_t checkpoint_every = 0;  // optimizer steps between checkpoints; 0 = JobEnvironment's default
  // Adapters: LoRA trains these over the frozen base (its seed is the job's `seed`), exported as `adapter_export`.
  AdapterMethod adapter = AdapterMethod::kNone;
  LoraOptions lora;
  AdapterExport adapter_export = AdapterExport::kAdapter;
};

// What the daemon, not the user, decides for a job: kept beside the spec so that the spec stays exactly what the
// user sent (and is stored and shown as such).
struct JobEnvironment {
  // Every file the job opens must resolve under one of these (empty: anywhere).
  std::vector<std::string> allowed_roots;
  // The NVMe tier's directories and I/O settings (its mode and layers are the spec's). A job that asks for
  // nvme_state without directories is refused.
  StateTierOptions nvme{};
  // Checkpoints (everything to resume exactly; see training_checkpoint.h). Empty disables them. When the
  // directory already holds a checkpoint of this job, the job resumes from it.
  std::string checkpoint_dir;
  int64_t default_checkpoint_every = 0;           // for specs that leave checkpoint_every at 0; 0 = only when suspended
  int64_t default_gpu_budget_bytes = 24ll << 30;  // for specs that leave gpu_budget_bytes at 0
};

// The largest job accepted: far beyond any real run, small enough that no product of these sizes with each other
// or with a model's bounded dimensions (ModelLimits, config.h) overflows int64 in the planner or the data order.
struct JobSizeLimits {
  static constexpr int64_t max_steps = int64_t{1} << 40;
  static constexpr int64_t max_epochs = int64_t{1} << 20;
  static constexpr int64_t max_batch_size = int64_t{1} << 20;
  static constexpr int64_t max_seq_len = int64_t{1} << 20;
  static constexpr int64_t max_micro_batch_tokens = int64_t{1} << 26;  // one forward
  static constexpr int64_t max_step_tokens = int64_t{1} << 34;         // one optimizer step
  static constexpr int64_t max_gpu_budget_bytes = int64_t{1} << 50;    // 1 PiB
  static constexpr int64_t max_layers = ModelLimits::max_layers;
};

// Validates ranges (not files): every message names the field. The choices are enums: the daemon maps the
// API's names to them once, at the boundary (server/job_proto.cc).
Status ValidateTrainingJobSpec(const TrainingJobSpec& spec);

// The job's paths before anything is loaded: each inside `allowed_roots`, the dataset a regular file when it
// exists (not a FIFO or a directory), output_dir a directory or not there yet. Errors name the field.
Status CheckTrainingJobPaths(const TrainingJobSpec& spec, const std::vector<std::string>& allowed_roots = {});

// Where the export goes, for the jobs that write one: output_dir is not model_dir, neither holds the other, and it
// is not (and does not hold) the dataset's directory; model_dir is not the dataset's directory. Compared resolved;
// errors name both fields.
Status CheckTrainingJobOutput(const TrainingJobSpec& spec);

struct TrainingStepEvent {
  int64_t step = 0, total_steps = 0;
  // What the job trains: every parameter of the model (full fine-tuning) or its adapters' (lora, qlora).
  int64_t trainable_params = 0, model_params = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_second = 0, model_tflops = 0, step_seconds = 0;
  double compute_seconds = 0, h2d_seconds = 0, d2h_seconds = 0, cpu_update_seconds = 0;
  double update_wait_seconds = 0;  // the engine blocked on optimizer updates (exposed update time)
  bool weights_first = false;      // this step's updates went weights first (SlidingOptions::weights_first)
  double overlap_ratio = 0;        // step / busiest resource: 1 = everything else hidden behind it
  std::string bounded_by;
  int64_t device_bytes = 0;  // device memory reserved by the allocator (CUDA; 0 on the CPU)
  int64_t host_bytes = 0;    // resident host memory of the process
  int64_t pinned_bytes = 0;  // page-locked host memory of the job's staging buffers (CUDA; 0 on the CPU)
  // The NVMe tier (backend empty without it): update time spent waiting on the disk this step, and the bytes
  // moved since the previous step event (checkpoints not counted).
  double nvme_wait_seconds = 0;
  int64_t nvme_read_bytes = 0, nvme_written_bytes = 0;
  std::string nvme_backend;
};

struct TrainingCallbacks {
  std::function<void(const std::string&)> on_log;
  std::function<void(const TrainingStepEvent&)> on_step;
};

struct TrainingResult {
  int64_t steps = 0;
  double final_loss = 0;
  double eval_loss = -1;  // -1 without a held-out split
  std::string export_dir;
  bool suspended = false;     // stopped by `suspend` after checkpointing: run it again to resume
  int64_t resumed_from = -1;  // the checkpoint step it started from (-1: from the model directory)
};

// Reads the model's config.json and runs the memory planner for this job (no weights loaded): the plan as a
// table, or RESOURCE_EXHAUSTED with needed vs available when the job cannot fit the GPU budget or this
// machine's memory. The daemon calls it at submission.
StatusOr<std::string> PlanTrainingJob(const TrainingJobSpec& spec, const JobEnvironment& env = {});

// The mean token loss of the model in `spec.model_dir` on the spec's held-out split (eval_fraction > 0), the
// split a training run of the same spec uses; nothing is trained. E.g. the loss of an exported model.
StatusOr<double> EvaluateHeldOutLoss(const TrainingJobSpec& spec, const JobEnvironment& env = {});

// `cancel` stops at the next step boundary (status CANCELLED). `suspend` stops there too, after writing a
// checkpoint (result.suspended): the daemon uses it on shutdown.
StatusOr<TrainingResult> RunTrainingJob(const TrainingJobSpec& spec, const JobEnvironment& env,
                                        const TrainingCallbacks& callbacks, const std::atomic<bool>* cancel,
                                        const std::atomic<bool>* suspend = nullptr);

}  // namespace slide
