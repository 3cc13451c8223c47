#include "engine/runtime/training_job.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "engine/common/files.h"
#include "engine/common/path_confinement.h"
#include "engine/data/dataset.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/model/peft_adapter.h"
#include "engine/quant/bnb_4bit.h"
#include "engine/quant/nf4.h"
#include "engine/quant/nf4_unit.h"
#include "engine/runtime/adapter_store.h"
#include "engine/runtime/device_info.h"
#include "engine/runtime/sliding_trainer.h"
#include "engine/runtime/torch_status.h"
#include "engine/runtime/trainer_resolver.h"
#include "engine/runtime/training_checkpoint.h"
#include "engine/runtime/training_job_checks.h"

namespace slide {

namespace {

int64_t DeviceReservedBytes(bool cuda) { return cuda ? ReadDeviceAllocatorStats().reserved_bytes : 0; }

MicroBatch ToMicroBatch(const std::vector<Sequence>& seqs, const std::vector<int64_t>& rows) {
  const int64_t S = static_cast<int64_t>(seqs.at(rows.at(0)).input_ids.size());
  at::Tensor ids = at::empty({static_cast<int64_t>(rows.size()), S}, at::kLong);
  at::Tensor labels = at::empty_like(ids);
  auto* pi = ids.data_ptr<int64_t>();
  auto* pl = labels.data_ptr<int64_t>();
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t t = 0; t < S; ++t) {
      pi[r * S + t] = seqs[rows[r]].input_ids[t];
      pl[r * S + t] = seqs[rows[r]].labels[t];
    }
  return {ids, ShiftLabels(labels)};
}

c10::ScalarType ComputeDtype(const TrainingJobSpec& spec, bool cuda);

// The trainer's options a job's spec asks for: device, dtype, AdamW, the schedule over `total_steps`, clipping.
TrainerOptions JobTrainerOptions(const TrainingJobSpec& spec, bool cuda, int64_t total_steps) {
  TrainerOptions o;
  o.adamw = {.lr = spec.lr,
             .beta1 = spec.adam_beta1,
             .beta2 = spec.adam_beta2,
             .eps = spec.adam_eps,
             .weight_decay = spec.weight_decay};
  o.schedule = {.kind = spec.lr_schedule,
                .peak_lr = spec.lr,
                .warmup_steps = spec.warmup_steps,
                .total_steps = std::max<int64_t>(1, total_steps)};
  o.max_grad_norm = spec.max_grad_norm;
  o.optimizer = spec.optimizer;
  o.compute_dtype = ComputeDtype(spec, cuda);
  o.device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  return o;
}

// What a job asks of its trainer: the options (the daemon's NVMe tier with the job's mode; GPU jobs in bf16 with
// their optimizer state in host memory update a share of their layers on the GPU) and the shape and budgets (on a
// GPU the memory the window leaves goes to resident layers; the NVMe tier keeps every unit's state on disk instead).
// ResolveTrainer derives the rest, for the plan at submission and the trainer alike.
StatusOr<ResolvedTrainer> ResolveJobTrainer(const ModelConfig& cfg, const TrainingJobSpec& spec,
                                            const JobEnvironment& env, const TrainerOptions& train) {
  const bool cuda = train.device.is_cuda();
  SlidingOptions o;
  o.train = train;
  o.nvme = env.nvme;
  o.nvme.mode = spec.nvme_state;
  o.nvme.layers = spec.nvme_layers;
  const bool lora = UsesAdapter(spec.adapter);
  if (lora) {
    o.adapter = spec.lora;
    o.adapter->seed = spec.seed;
  }
  if (spec.adapter == AdapterMethod::kQLora) o.nf4_base = Nf4BaseOptions{.double_quant = true};
  o.device_update_share = DefaultDeviceUpdateShare(o);
  PlanRequest budget;
  budget.micro_batch = MicroBatchSize(spec);
  budget.seq_len = spec.seq_len;
  budget.grad_accum = spec.batch_size / budget.micro_batch;
  budget.device_budget_bytes = spec.gpu_budget_bytes > 0 ? spec.gpu_budget_bytes : env.default_gpu_budget_bytes;
  budget.host_budget_bytes = PhysicalHostBytes();
  budget.window = spec.window;
  budget.checkpoints = spec.activation_placement;
  if (!cuda) budget.device_reserved_bytes = 0;
  budget.resident_layers = cuda && !lora ? -1 : 0;  // adapter mode: the window is the frozen base's residency
  return ResolveTrainer(cfg, std::move(o), std::move(budget));
}

// The roots the job's file reads are confined to: the allowed roots plus the daemon's own checkpoint directory.
std::vector<std::string> ConfinementRoots(const JobEnvironment& env) {
  std::vector<std::string> roots = env.allowed_roots;
  if (!roots.empty() && !env.checkpoint_dir.empty()) roots.push_back(env.checkpoint_dir);
  return roots;
}

// What the spec asks of the daemon's environment: the NVMe tier needs its directories.
Status CheckEnvironment(const TrainingJobSpec& spec, const JobEnvironment& env) {
  if (spec.nvme_state != TierMode::kNone && env.nvme.io.dirs.empty())
    return FailedPrecondition(std::string("job field 'nvme_state' is '") + TierModeName(spec.nvme_state) +
                              "', but this daemon has no NVMe tier (its config's nvme.dirs is empty)");
  return Status::Ok();
}

// Everything checked before a job plans or runs: the spec's ranges, the environment it needs, its paths.
Status CheckJob(const TrainingJobSpec& spec, const JobEnvironment& env) {
  SLIDE_RETURN_IF_ERROR(ValidateTrainingJobSpec(spec));
  SLIDE_RETURN_IF_ERROR(CheckEnvironment(spec, env));
  return CheckTrainingJobPaths(spec, env.allowed_roots);
}

// The job's fields that depend on the model: its layer count (nvme_layers) and its context (seq_len).
Status CheckSpecAgainstModel(const TrainingJobSpec& spec, const ModelConfig& cfg) {
  if (UsesAdapter(spec.adapter)) {  // targets the model has, r within every targeted projection
    const Status lora = ValidateLoraOptions(spec.lora, cfg);
    if (!lora.ok()) return InvalidArgument("job field " + lora.message());
  }
  if (spec.adapter == AdapterMethod::kQLora) {  // NF4 quantises whole blocks of 64 weights
    const ModelLayout layout = BuildModelLayout(cfg);
    for (int64_t l = 0; l < layout.num_layers(); ++l)
      for (const ParamSpec& p : layout.layer(l).params)
        if (p.shape.size() == 2)
          if (Status st = CheckNf4Numel(p.numel, "tensor '" + p.name + "'"); !st.ok())
            return InvalidArgument("job field 'adapter' is qlora, but " + st.message());
  }
  SLIDE_RETURN_IF_ERROR(Field(
      spec.nvme_layers <= cfg.num_layers, "nvme_layers",
      "(" + std::to_string(spec.nvme_layers) + ") exceeds the model's " + std::to_string(cfg.num_layers) + " layers"));
  if (spec.allow_seq_len_beyond_model || spec.seq_len <= cfg.max_position_embeddings) return Status::Ok();
  return InvalidArgument(
      "job field 'seq_len' (" + std::to_string(spec.seq_len) + ") exceeds the model's max_position_embeddings (" +
      std::to_string(cfg.max_position_embeddings) + "); set allow_seq_len_beyond_model to train beyond it");
}

// A model saved in 4 bits by bitsandbytes trains QLoRA only: its base is the NF4 arrays as stored.
Status CheckQuantisedCheckpoint(const TrainingJobSpec& spec) {
  SLIDE_ASSIGN_OR_RETURN(const std::optional<Bnb4bitFormat> four_bit, ReadBnb4bitFormat(spec.model_dir));
  if (four_bit && spec.adapter != AdapterMethod::kQLora)
    return InvalidArgument(std::string("job field 'adapter' is ") + AdapterMethodName(spec.adapter) + ", but " +
                           spec.model_dir + " is saved in 4 bits by bitsandbytes: it trains with adapter: qlora");
  return Status::Ok();
}

// What a checkpoint must match of the job's adapter: a resume never continues with other adapter settings.
std::string AdapterFingerprint(const TrainingJobSpec& spec) {
  if (!UsesAdapter(spec.adapter)) return "";
  std::string targets;
  for (const auto& t : spec.lora.target_modules) targets += (targets.empty() ? "" : ",") + t;
  char buf[96];
  std::snprintf(buf, sizeof(buf), " lora_r=%lld lora_alpha=%.17g lora_dropout=%.17g",
                static_cast<long long>(spec.lora.r), spec.lora.alpha, spec.lora.dropout);
  // A QLoRA run's adapters were trained against the NF4 base: not to be resumed over the bf16 one, nor the reverse.
  return buf + std::string(" lora_targets=") + targets + (spec.adapter == AdapterMethod::kQLora ? " base=nf4" : "");
}

// A messages dataset's template, at submission: it must exist and compile, and render a plain exchange without a
// construct the engine lacks.
Status CheckChatTemplate(const TrainingJobSpec& spec) {
  if (spec.dataset_format != DatasetFormat::kMessages) return Status::Ok();
  auto chat_template = ResolveChatTemplate(spec.chat_template, spec.model_dir);
  if (!chat_template.ok()) return chat_template.status();
  SLIDE_ASSIGN_OR_RETURN(SpecialTokens tokens, LoadSpecialTokens(spec.model_dir, nullptr));
  return CheckChatTemplateSupport(**chat_template, tokens);
}

// A job stops preparing as soon as it is cancelled (CANCELLED) or suspended for shutdown (kSuspendedWhilePreparing,
// which RunTrainingJob turns into a suspended result): asked between dataset lines and weight tensors.
constexpr const char* kSuspendedWhilePreparing = "suspended while preparing";
Status Interrupted(const std::atomic<bool>* cancel, const std::atomic<bool>* suspend, const char* phase) {
  if (cancel != nullptr && cancel->load())
    return Status(StatusCode::kCancelled, std::string("cancelled while preparing (") + phase + ")");
  if (suspend != nullptr && suspend->load()) return Status(StatusCode::kUnavailable, kSuspendedWhilePreparing);
  return Status::Ok();
}

bool UsesCuda(const TrainingJobSpec& spec) {
  return spec.device == DeviceChoice::kCuda || (spec.device == DeviceChoice::kAuto && at::hasCUDA());
}

c10::ScalarType ComputeDtype(const TrainingJobSpec& spec, bool cuda) {
  switch (spec.compute_dtype) {
    case ComputeDtypeChoice::kBf16:
      return c10::kBFloat16;
    case ComputeDtypeChoice::kFp32:
      return c10::kFloat;
    case ComputeDtypeChoice::kAuto:
      break;
  }
  return cuda ? c10::kBFloat16 : c10::kFloat;
}

// The job's tokenizer (from the model directory) and its dataset, split into training and held-out sequences
// exactly as every run of this spec splits it.
StatusOr<Dataset> LoadJobDataset(const TrainingJobSpec& spec, const ModelConfig& cfg,
                                 std::function<Status()> interrupted = {}) {
  SLIDE_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromFile(spec.model_dir + "/tokenizer.json"));
  if (tokenizer->vocab_size() > cfg.vocab_size)
    return InvalidArgument("tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                           " tokens but the model's vocab_size is " + std::to_string(cfg.vocab_size));
  SLIDE_ASSIGN_OR_RETURN(DatasetOptions d, ModelDatasetOptions(spec.model_dir, *tokenizer, spec.dataset_format,
                                                               spec.chat_template, spec.train_on));
  d.seq_len = spec.seq_len;
  d.mode = spec.sequence_mode;
  d.bad_lines = spec.bad_lines;
  d.eval_fraction = spec.eval_fraction;
  d.seed = spec.seed;
  d.interrupted = std::move(interrupted);
  return LoadJsonlDataset(spec.dataset_path, *tokenizer, d);
}

std::vector<MicroBatch> HeldOutBatches(const Dataset& ds, int64_t micro) {
  std::vector<MicroBatch> eval;
  for (int64_t i = 0; i < static_cast<int64_t>(ds.eval.size()); i += micro) {
    std::vector<int64_t> rows;
    for (int64_t k = i; k < std::min<int64_t>(i + micro, ds.eval.size()); ++k) rows.push_back(k);
    eval.push_back(ToMicroBatch(ds.eval, rows));
  }
  return eval;
}

}  // namespace

StatusOr<double> EvaluateHeldOutLoss(const TrainingJobSpec& spec, const JobEnvironment& env) {
  SLIDE_RETURN_IF_ERROR(CheckJob(spec, env));
  ScopedFileConfinement confine(ConfinementRoots(env));
  return StatusFromExceptions<double>([&]() -> StatusOr<double> {
    const bool cuda = UsesCuda(spec);
    SLIDE_ASSIGN_OR_RETURN(ModelConfig cfg, LoadHfConfig(spec.model_dir));
    SLIDE_ASSIGN_OR_RETURN(Dataset ds, LoadJobDataset(spec, cfg));
    if (ds.eval.empty())
      return FailedPrecondition("job field 'eval_fraction' (" + std::to_string(spec.eval_fraction) +
                                ") leaves no held-out sequences to evaluate");
    const int64_t micro = MicroBatchSize(spec);
    SLIDE_ASSIGN_OR_RETURN(ModelParams master, LoadHfCheckpoint(spec.model_dir, cfg, c10::kFloat));
    SLIDE_ASSIGN_OR_RETURN(ResolvedTrainer resolved,
                           ResolveJobTrainer(cfg, spec, env, JobTrainerOptions(spec, cuda, 1)));
    SLIDE_ASSIGN_OR_RETURN(auto trainer, SlidingTrainer::Create(cfg, std::move(master), resolved));
    return trainer->EvalLoss(HeldOutBatches(ds, micro));
  });
}

StatusOr<std::string> PlanTrainingJob(const TrainingJobSpec& spec, const JobEnvironment& env) {
  SLIDE_RETURN_IF_ERROR(CheckJob(spec, env));
  SLIDE_RETURN_IF_ERROR(CheckTrainingJobOutput(spec));
  ScopedFileConfinement confine(ConfinementRoots(env));
  SLIDE_ASSIGN_OR_RETURN(ModelConfig cfg, LoadHfConfig(spec.model_dir));
  SLIDE_RETURN_IF_ERROR(CheckSpecAgainstModel(spec, cfg));
  SLIDE_RETURN_IF_ERROR(CheckChatTemplate(spec));
  // The config's dimensions against the weights' own headers (no data read): a config.json that claims more than
  // its files hold is refused here, not after the planner has sized buffers for it.
  SLIDE_RETURN_IF_ERROR(CheckHfCheckpoint(spec.model_dir, cfg));
  SLIDE_RETURN_IF_ERROR(CheckQuantisedCheckpoint(spec));
  SLIDE_ASSIGN_OR_RETURN(ResolvedTrainer resolved,
                         ResolveJobTrainer(cfg, spec, env, JobTrainerOptions(spec, UsesCuda(spec), 1)));
  return resolved.plan.ToString();
}

namespace {

// Whether `inner` is `outer` or lies under it (both resolved).
bool Within(const std::string& inner, const std::string& outer) {
  return inner == outer || outer == "/" || inner.rfind(outer + "/", 0) == 0;
}

}  // namespace

// The export writes config.json, weights and tokenizer files into output_dir: it must not be the model it reads,
// nor hold or sit inside it, nor be the dataset's directory (or hold it). The model directory is not the dataset's
// directory either. Compared after resolving links, so a second path to the same directory is caught too.
Status CheckTrainingJobOutput(const TrainingJobSpec& s) {
  SLIDE_ASSIGN_OR_RETURN(const std::string out, ResolvePath(s.output_dir));
  SLIDE_ASSIGN_OR_RETURN(const std::string model, ResolvePath(s.model_dir));
  const size_t slash = s.dataset_path.find_last_of('/');
  SLIDE_ASSIGN_OR_RETURN(const std::string data_dir, ResolvePath(slash == 0 ? "/" : s.dataset_path.substr(0, slash)));
  auto refuse = [&](const std::string& a, const std::string& a_path, const std::string& b, const std::string& b_path,
                    const std::string& why) {
    return InvalidArgument("job fields '" + a + "' ('" + a_path + "') and '" + b + "' ('" + b_path + "') " + why);
  };
  if (Within(out, model) || Within(model, out))
    return refuse("output_dir", s.output_dir, "model_dir", s.model_dir,
                  out == model ? "are the same directory: the export would overwrite the model"
                               : "contain one another: the export would write into the model's files");
  if (Within(data_dir, out))
    return refuse("output_dir", s.output_dir, "dataset", s.dataset_path,
                  "overlap: the output directory is or holds the dataset's directory");
  if (model == data_dir)
    return refuse("model_dir", s.model_dir, "dataset", s.dataset_path,
                  "overlap: the dataset lies in the model directory (keep data and model apart)");
  return Status::Ok();
}

Status CheckTrainingJobPaths(const TrainingJobSpec& s, const std::vector<std::string>& allowed_roots) {
  for (const auto& [field, path] : {std::pair<const char*, const std::string&>{"model_dir", s.model_dir},
                                    {"dataset", s.dataset_path},
                                    {"output_dir", s.output_dir}})
    SLIDE_RETURN_IF_ERROR(CheckJobPath(field, path, allowed_roots));
  struct stat st {};
  // A dataset that is not there yet fails when the job opens it; one that is not a regular file never works.
  if (Status dataset = CheckRegularFile(s.dataset_path); !dataset.ok() && dataset.code() != StatusCode::kNotFound)
    return dataset.WithContext("job field 'dataset'");
  // The files the export copies are read only after training: a bad one must fail the job now, not then.
  for (const std::string& name : CompanionFilesCopiedOnExport()) {
    const std::string path = s.model_dir + "/" + name;
    if (::lstat(path.c_str(), &st) != 0) continue;
    SLIDE_RETURN_IF_ERROR(CheckJobPath("model_dir", path, allowed_roots));
    if (Status file = CheckRegularFile(path); !file.ok() && file.code() != StatusCode::kNotFound)
      return file.WithContext("job field 'model_dir'");
  }
  if (::stat(s.output_dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return InvalidArgument("job field 'output_dir': '" + s.output_dir +
                           "' exists and is not a directory (the export needs a directory)");
  return Status::Ok();
}

namespace {

// One job from its files to its export, in three phases with one job each. RunTrainingJob runs them inside the
// job's file confinement and turns LibTorch's exceptions into statuses.
class TrainingRun {
 public:
  TrainingRun(const TrainingJobSpec& spec, const JobEnvironment& env, const OutputDirectory& output,
              const TrainingCallbacks& cb, const std::atomic<bool>* cancel, const std::atomic<bool>* suspend)
      : spec_(spec),
        env_(env),
        checkpoint_every_(spec.checkpoint_every > 0 ? spec.checkpoint_every : env.default_checkpoint_every),
        output_(output),
        cb_(cb),
        cancel_(cancel),
        suspend_(suspend) {}

  // Config, dataset, weights, memory plan and trainer; resumes from the job's checkpoint when it has one.
  Status Prepare();
  // The optimizer steps with their events and checkpoints; stops at a step boundary when cancelled (CANCELLED)
  // or suspended (result().suspended, after a checkpoint).
  Status Train();
  // Held-out loss and the Hugging Face export.
  Status Finish();
  const TrainingResult& result() const { return result_; }

 private:
  void Log(const std::string& m) const {
    if (cb_.on_log) cb_.on_log(m);
  }
  Status Checkpoint(int64_t steps_done);
  void ReportStep(const StepStats& st);
  void SkipNvmeTraffic();  // the tier's bytes so far are not a step's (loading, checkpoints)
  // 6 per parameter for full fine-tuning; a frozen base takes 4 (no weight gradient), its adapters 6 each.
  double ModelFlopsPerToken() const {
    const double n = static_cast<double>(cfg_.TotalParamCount());
    const AdapterStore* a = trainer_->adapters();
    return a ? 4.0 * n + 6.0 * static_cast<double>(a->layout().TrainableParams()) : 6.0 * n;
  }

  Status Interrupted(const char* phase) const { return slide::Interrupted(cancel_, suspend_, phase); }

  const TrainingJobSpec& spec_;
  const JobEnvironment& env_;
  const int64_t checkpoint_every_;  // the spec's, else the daemon's default
  const OutputDirectory& output_;   // opened once before the run: the export is written through it
  const TrainingCallbacks& cb_;
  const std::atomic<bool>* cancel_;
  const std::atomic<bool>* suspend_;
  bool cuda_ = false;
  ModelConfig cfg_;
  Dataset ds_;
  std::unique_ptr<SlidingTrainer> trainer_;
  std::unique_ptr<BatchOrder> order_;
  int64_t micro_ = 0, accum_ = 0, total_ = 0;
  int64_t first_step_ = 0, last_checkpoint_ = 0;            // the newest step on disk (or the start)
  std::string fingerprint_;                                 // what a checkpoint must match to be resumed by this job
  int64_t nvme_read_before_ = 0, nvme_written_before_ = 0;  // the tier's counters at the last step event
  TrainingResult result_;
};

Status TrainingRun::Prepare() {
  cuda_ = UsesCuda(spec_);
  if (cuda_ && !at::hasCUDA())
    return Status(StatusCode::kFailedPrecondition, "device 'cuda' requested but no CUDA device is present");
  const c10::ScalarType dtype = ComputeDtype(spec_, cuda_);

  SLIDE_ASSIGN_OR_RETURN(cfg_, LoadHfConfig(spec_.model_dir));
  SLIDE_RETURN_IF_ERROR(CheckSpecAgainstModel(spec_, cfg_));
  SLIDE_RETURN_IF_ERROR(CheckQuantisedCheckpoint(spec_));
  SLIDE_RETURN_IF_ERROR(Interrupted("model config read"));
  SLIDE_ASSIGN_OR_RETURN(ds_, LoadJobDataset(spec_, cfg_, [this] { return Interrupted("reading the dataset"); }));
  Log("dataset: " + std::to_string(ds_.stats.samples) + " samples, " + std::to_string(ds_.train.size()) +
      " training and " + std::to_string(ds_.eval.size()) + " held-out sequences of " + std::to_string(spec_.seq_len) +
      " tokens; " + std::to_string(ds_.stats.skipped) + " lines skipped");
  for (const auto& e : ds_.stats.errors) Log("skipped: " + e);

  micro_ = MicroBatchSize(spec_);
  accum_ = spec_.batch_size / micro_;
  const int64_t n_train = static_cast<int64_t>(ds_.train.size());
  // epochs and batch_size are bounded (JobSizeLimits) and n_train is a count of sequences in memory: no overflow.
  total_ = spec_.steps > 0 ? spec_.steps
                           : std::max<int64_t>(1, (spec_.epochs * n_train + spec_.batch_size - 1) / spec_.batch_size);
  if (total_ > JobSizeLimits::max_steps)
    return InvalidArgument("job field 'epochs' (" + std::to_string(spec_.epochs) + ") over " + std::to_string(n_train) +
                           " training sequences gives " + std::to_string(total_) + " steps; at most " +
                           std::to_string(JobSizeLimits::max_steps));
  // A frozen base (adapter mode) is read straight into the compute dtype: 2 bytes a parameter for bf16. QLoRA's
  // decoder layers are quantised as each is read, so the base is never whole in the compute dtype.
  const bool lora = UsesAdapter(spec_.adapter);
  std::vector<Nf4Unit> nf4_layers;
  ModelParams master;
  auto interrupted = [this] { return Interrupted("loading the weights"); };
  if (spec_.adapter == AdapterMethod::kQLora) {
    master.layout = BuildModelLayout(cfg_);
    master.units.resize(master.layout.units.size());
    SLIDE_RETURN_IF_ERROR(LoadHfCheckpointUnits(
        spec_.model_dir, cfg_, dtype,
        [&](size_t u, LoadedUnit&& loaded) -> Status {
          if (loaded.nf4) {  // a checkpoint saved in 4 bits: its arrays as stored
            nf4_layers.push_back(std::move(*loaded.nf4));
          } else if (master.layout.units[u].kind == UnitKind::kDecoderLayer) {
            nf4_layers.push_back(QuantizeNf4Unit(master.layout.units[u], loaded.flat, /*double_quant=*/true, dtype,
                                                 [](int64_t n, c10::ScalarType t) { return at::empty({n}, t); }));
          } else {
            master.units[u] = std::move(loaded.flat);
          }
          return Status::Ok();
        },
        interrupted));
  } else {
    SLIDE_ASSIGN_OR_RETURN(master, LoadHfCheckpoint(spec_.model_dir, cfg_, lora ? dtype : c10::kFloat, interrupted));
  }
  SLIDE_ASSIGN_OR_RETURN(ResolvedTrainer resolved,
                         ResolveJobTrainer(cfg_, spec_, env_, JobTrainerOptions(spec_, cuda_, total_)));
  const MemoryPlan& plan = resolved.plan;
  SLIDE_ASSIGN_OR_RETURN(trainer_, SlidingTrainer::Create(cfg_, std::move(master), resolved, std::move(nf4_layers)));
  Log("memory plan:\n" + plan.ToString());
  if (trainer_->tier() != nullptr) Log("optimizer state: " + trainer_->tier()->description());
  Log("training " + std::to_string(total_) + " steps on " + (cuda_ ? "cuda" : "cpu") + " in " +
      (dtype == c10::kBFloat16 ? "bf16" : "fp32") + ", optimizer " + OptimizerName(spec_.optimizer));
  if (const AdapterStore* adapters = trainer_->adapters(); adapters != nullptr) {
    const int64_t trainable = adapters->layout().TrainableParams(), all = cfg_.TotalParamCount();
    std::string targets;
    for (const auto& t : spec_.lora.target_modules) targets += (targets.empty() ? "" : ",") + t;
    char line[256];
    std::snprintf(
        line, sizeof(line), "mode: %s r %lld, alpha %g, dropout %g on %s; %lld trainable of %lld parameters (%.3f%%)",
        spec_.adapter == AdapterMethod::kQLora ? "QLoRA (NF4 base, double quantised)" : "LoRA",
        static_cast<long long>(spec_.lora.r), spec_.lora.alpha, spec_.lora.dropout, targets.c_str(),
        static_cast<long long>(trainable), static_cast<long long>(all), 100.0 * double(trainable) / double(all));
    Log(line);
  }

  order_ = std::make_unique<BatchOrder>(n_train, spec_.seed);
  fingerprint_ = "params=" + std::to_string(cfg_.TotalParamCount()) + " layers=" + std::to_string(cfg_.num_layers) +
                 " batch=" + std::to_string(spec_.batch_size) + " micro=" + std::to_string(micro_) +
                 " seq=" + std::to_string(spec_.seq_len) + " train_sequences=" + std::to_string(n_train) +
                 " seed=" + std::to_string(spec_.seed) + " total_steps=" + std::to_string(total_) +
                 AdapterFingerprint(spec_);
  if (!env_.checkpoint_dir.empty()) {
    SLIDE_ASSIGN_OR_RETURN(auto resumed,
                           LoadTrainingCheckpoint(env_.checkpoint_dir, {fingerprint_, total_, n_train}, *trainer_));
    if (resumed) {
      first_step_ = resumed->step;
      order_->Seek({resumed->order_epoch, resumed->order_index});
      result_.resumed_from = first_step_;
      result_.steps = first_step_;
      result_.final_loss = resumed->loss;
      Log("resumed from the checkpoint at step " + std::to_string(first_step_));
    }
  }
  last_checkpoint_ = first_step_;
  return Status::Ok();
}

Status TrainingRun::Checkpoint(int64_t steps_done) {
  CheckpointInfo info;
  info.step = steps_done;
  info.total_steps = total_;
  info.order_epoch = order_->position().epoch;
  info.order_index = order_->position().index;
  info.loss = result_.final_loss;
  info.fingerprint = fingerprint_;
  trainer_->WaitForUpdates();  // the step's own update time is not the checkpoint's
  const auto t0 = std::chrono::steady_clock::now();
  SLIDE_RETURN_IF_ERROR(SaveTrainingCheckpoint(env_.checkpoint_dir, info, *trainer_));
  SkipNvmeTraffic();
  last_checkpoint_ = steps_done;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // master + two moments, fp32: what the engine thread just wrote (the step waits for it); the adapters' alone in
  // adapter mode.
  const AdapterStore* adapters = trainer_->adapters();
  const double gb =
      12.0 * static_cast<double>(adapters ? adapters->layout().TrainableParams() : cfg_.TotalParamCount()) / 1e9;
  char line[160];
  std::snprintf(line, sizeof(line), "checkpoint at step %lld: %.2f GB in %.2f s (%.2f GB/s)",
                static_cast<long long>(steps_done), gb, secs, secs > 0 ? gb / secs : 0.0);
  Log(line);
  return Status::Ok();
}

void TrainingRun::SkipNvmeTraffic() {
  if (const StateTier* tier = trainer_->tier(); tier != nullptr) {
    nvme_read_before_ = tier->store().bytes_read();
    nvme_written_before_ = tier->store().bytes_written();
  }
}

void TrainingRun::ReportStep(const StepStats& st) {
  if (!cb_.on_step || (st.step % spec_.log_every != 0 && st.step != total_)) return;
  const ResourceBusy& b = trainer_->last_busy();
  TrainingStepEvent e;
  e.step = st.step;
  e.total_steps = total_;
  e.model_params = cfg_.TotalParamCount();
  const AdapterStore* adapters = trainer_->adapters();
  e.trainable_params = adapters != nullptr ? adapters->layout().TrainableParams() : e.model_params;
  e.loss = st.loss;
  e.lr = st.lr;
  e.grad_norm = st.grad_norm;
  e.step_seconds = b.step;
  const double tokens = static_cast<double>(spec_.batch_size * spec_.seq_len);
  e.tokens_per_second = b.step > 0 ? tokens / b.step : 0;
  e.model_tflops = b.step > 0 ? ModelFlopsPerToken() * tokens / b.step / 1e12 : 0;
  e.compute_seconds = b.compute;
  e.h2d_seconds = b.h2d;
  e.d2h_seconds = b.d2h;
  e.cpu_update_seconds = b.cpu_update;
  e.update_wait_seconds = b.wait_update;
  e.weights_first = b.weights_first;
  e.overlap_ratio = b.OverlapRatio();
  e.device_bytes = DeviceReservedBytes(cuda_);
  e.host_bytes = ResidentHostBytes();
  e.pinned_bytes = trainer_->pinned_bytes();
  if (const StateTier* tier = trainer_->tier(); tier != nullptr) {
    e.nvme_wait_seconds = b.nvme;
    e.nvme_read_bytes = tier->store().bytes_read() - nvme_read_before_;
    e.nvme_written_bytes = tier->store().bytes_written() - nvme_written_before_;
    nvme_read_before_ += e.nvme_read_bytes;
    nvme_written_before_ += e.nvme_written_bytes;
    e.nvme_backend = tier->store().backend_name();
  }
  e.bounded_by = cuda_ ? b.Bound() : (std::string(b.Bound()) == "gpu_compute" ? "compute (cpu)" : b.Bound());
  cb_.on_step(e);
}

Status TrainingRun::Train() {
  SkipNvmeTraffic();  // the master written at the start, a resumed checkpoint's state
  for (int64_t step = first_step_; step < total_; ++step) {
    if (cancel_ != nullptr && cancel_->load())
      return Status(StatusCode::kCancelled, "cancelled at step " + std::to_string(step));
    if (suspend_ != nullptr && suspend_->load()) {
      if (!env_.checkpoint_dir.empty() && step > last_checkpoint_) SLIDE_RETURN_IF_ERROR(Checkpoint(step));
      result_.suspended = true;
      return Status::Ok();
    }
    std::vector<MicroBatch> mbs;
    for (int64_t a = 0; a < accum_; ++a) mbs.push_back(ToMicroBatch(ds_.train, order_->Next(micro_)));
    SLIDE_ASSIGN_OR_RETURN(StepStats st, trainer_->Step(mbs));
    result_.steps = st.step;
    result_.final_loss = st.loss;
    ReportStep(st);
    // The job's policy for a non-finite step: it fails, before any checkpoint or export could keep what it made.
    if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm))
      return DataLoss("step " + std::to_string(st.step) + " gave a non-finite " +
                      (std::isfinite(st.loss) ? "gradient norm (" + std::to_string(st.grad_norm) + ")"
                                              : "loss (" + std::to_string(st.loss) + ")") +
                      "; the job stops without exporting (lower lr, or check the model's weights and the data)");
    if (!env_.checkpoint_dir.empty() && checkpoint_every_ > 0 && st.step % checkpoint_every_ == 0 && st.step < total_)
      SLIDE_RETURN_IF_ERROR(Checkpoint(st.step));
  }
  return Status::Ok();
}

Status TrainingRun::Finish() {
  if (!ds_.eval.empty()) {
    SLIDE_ASSIGN_OR_RETURN(result_.eval_loss, trainer_->EvalLoss(HeldOutBatches(ds_, micro_)));
    if (!std::isfinite(result_.eval_loss))
      return DataLoss("the held-out loss is not finite (" + std::to_string(result_.eval_loss) +
                      "); the job stops without exporting");
    Log("held-out loss " + std::to_string(result_.eval_loss));
  }
  ExportOptions export_options;
  export_options.dtype = spec_.export_dtype == ExportDtype::kFp32 ? c10::kFloat : c10::kBFloat16;
  if (const AdapterStore* adapters = trainer_->adapters(); adapters != nullptr) {
    if (spec_.adapter_export == AdapterExport::kAdapter) {
      SLIDE_RETURN_IF_ERROR(ExportPeftAdapter(output_, spec_.lora, adapters->layout(), adapters->MasterOnHost(),
                                              spec_.model_dir, export_options.dtype));
      Log("exported the LoRA adapter (PEFT's adapter_config.json and adapter_model.safetensors) to " +
          spec_.output_dir);
    } else {
      SLIDE_RETURN_IF_ERROR(ExportHfCheckpoint(output_, spec_.model_dir, trainer_->MergedWeights(), export_options));
      Log("exported the base with the LoRA adapter merged into it to " + spec_.output_dir);
    }
  } else {
    SLIDE_RETURN_IF_ERROR(ExportHfCheckpoint(output_, spec_.model_dir, trainer_->Master(), export_options));
    Log("exported to " + spec_.output_dir);
  }
  result_.export_dir = spec_.output_dir;
  return Status::Ok();
}

}  // namespace

StatusOr<TrainingResult> RunTrainingJob(const TrainingJobSpec& spec, const JobEnvironment& env,
                                        const TrainingCallbacks& cb, const std::atomic<bool>* cancel,
                                        const std::atomic<bool>* suspend) {
  SLIDE_RETURN_IF_ERROR(CheckJob(spec, env));
  SLIDE_RETURN_IF_ERROR(CheckTrainingJobOutput(spec));
  // The export is written only after every step: a location that cannot take it fails the job now. The directory
  // is opened once, here, and the export writes through that descriptor: a symlink swapped in for the path while
  // the job runs cannot send the export elsewhere.
  auto output = OutputDirectory::Open(spec.output_dir, env.allowed_roots);
  if (!output.ok()) return output.status().WithContext("job field 'output_dir'");
  ScopedFileConfinement confine(ConfinementRoots(env));
  return StatusFromExceptions<TrainingResult>([&]() -> StatusOr<TrainingResult> {
    TrainingRun run(spec, env, output.value(), cb, cancel, suspend);
    if (Status prepared = run.Prepare(); !prepared.ok()) {
      if (prepared.code() != StatusCode::kUnavailable || prepared.message() != kSuspendedWhilePreparing)
        return prepared;
      TrainingResult suspended;  // nothing to checkpoint yet: the job starts over when the daemon comes back
      suspended.suspended = true;
      return suspended;
    }
    SLIDE_RETURN_IF_ERROR(run.Train());
    if (!run.result().suspended) SLIDE_RETURN_IF_ERROR(run.Finish());
    return run.result();
  });
}

}  // namespace slide
