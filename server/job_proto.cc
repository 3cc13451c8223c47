#include "server/job_proto.h"

#include <google/protobuf/generated_enum_reflection.h>

#include "proto/enum_short_names.h"

namespace slide {
namespace {

// The spec's choices: each API value beside the engine's, one table per choice. UNSPECIFIED (0) is not in
// them: it keeps the engine's default.
template <typename P, typename E>
struct Choice {
  P api;
  E engine;
};
constexpr Choice<v1::LrSchedule, LrScheduleKind> kLrSchedules[] = {
    {v1::LR_SCHEDULE_CONSTANT, LrScheduleKind::kConstant},
    {v1::LR_SCHEDULE_LINEAR, LrScheduleKind::kLinear},
    {v1::LR_SCHEDULE_COSINE, LrScheduleKind::kCosine}};
constexpr Choice<v1::DatasetFormat, DatasetFormat> kDatasetFormats[] = {
    {v1::DATASET_FORMAT_AUTO, DatasetFormat::kAuto},
    {v1::DATASET_FORMAT_TEXT, DatasetFormat::kText},
    {v1::DATASET_FORMAT_PROMPT_COMPLETION, DatasetFormat::kPromptCompletion},
    {v1::DATASET_FORMAT_MESSAGES, DatasetFormat::kMessages},
    {v1::DATASET_FORMAT_TOKENS, DatasetFormat::kTokens}};
constexpr Choice<v1::ChatTemplate, ChatTemplateChoice> kChatTemplates[] = {
    {v1::CHAT_TEMPLATE_AUTO, ChatTemplateChoice::kAuto},
    {v1::CHAT_TEMPLATE_LLAMA3, ChatTemplateChoice::kLlama3},
    {v1::CHAT_TEMPLATE_CHATML, ChatTemplateChoice::kChatML}};
constexpr Choice<v1::TrainOn, TrainOn> kTrainOn[] = {{v1::TRAIN_ON_ASSISTANT, TrainOn::kAssistant},
                                                     {v1::TRAIN_ON_ALL, TrainOn::kAll}};
constexpr Choice<v1::SequenceMode, SequenceMode> kSequenceModes[] = {
    {v1::SEQUENCE_MODE_PACK, SequenceMode::kPack}, {v1::SEQUENCE_MODE_TRUNCATE, SequenceMode::kTruncate}};
constexpr Choice<v1::BadLines, BadLinePolicy> kBadLines[] = {{v1::BAD_LINES_FAIL, BadLinePolicy::kFail},
                                                             {v1::BAD_LINES_SKIP, BadLinePolicy::kSkip}};
constexpr Choice<v1::Device, DeviceChoice> kDevices[] = {{v1::DEVICE_AUTO, DeviceChoice::kAuto},
                                                         {v1::DEVICE_CPU, DeviceChoice::kCpu},
                                                         {v1::DEVICE_CUDA, DeviceChoice::kCuda}};
constexpr Choice<v1::ComputeDtype, ComputeDtypeChoice> kComputeDtypes[] = {
    {v1::COMPUTE_DTYPE_AUTO, ComputeDtypeChoice::kAuto},
    {v1::COMPUTE_DTYPE_BF16, ComputeDtypeChoice::kBf16},
    {v1::COMPUTE_DTYPE_FP32, ComputeDtypeChoice::kFp32}};
constexpr Choice<v1::ActivationPlacement, CheckpointPlacement> kPlacements[] = {
    {v1::ACTIVATION_PLACEMENT_AUTO, CheckpointPlacement::kAuto},
    {v1::ACTIVATION_PLACEMENT_DEVICE, CheckpointPlacement::kDevice},
    {v1::ACTIVATION_PLACEMENT_HOST, CheckpointPlacement::kHost}};
constexpr Choice<v1::ExportDtype, ExportDtype> kExportDtypes[] = {{v1::EXPORT_DTYPE_BF16, ExportDtype::kBf16},
                                                                  {v1::EXPORT_DTYPE_FP32, ExportDtype::kFp32}};
constexpr Choice<v1::NvmeState, TierMode> kNvmeStates[] = {
    {v1::NVME_STATE_NONE, TierMode::kNone},
    {v1::NVME_STATE_MOMENTS, TierMode::kMoments},
    {v1::NVME_STATE_MOMENTS_AND_MASTER, TierMode::kMomentsAndMaster}};
constexpr Choice<v1::Adapter, AdapterMethod> kAdapters[] = {{v1::ADAPTER_NONE, AdapterMethod::kNone},
                                                            {v1::ADAPTER_LORA, AdapterMethod::kLora},
                                                            {v1::ADAPTER_QLORA, AdapterMethod::kQLora}};
constexpr Choice<v1::AdapterExport, AdapterExport> kAdapterExports[] = {
    {v1::ADAPTER_EXPORT_ADAPTER, AdapterExport::kAdapter}, {v1::ADAPTER_EXPORT_MERGED, AdapterExport::kMerged}};
constexpr Choice<v1::Optimizer, OptimizerKind> kOptimizers[] = {{v1::OPTIMIZER_ADAMW, OptimizerKind::kAdamW},
                                                                {v1::OPTIMIZER_ADAMW_8BIT, OptimizerKind::kAdamW8bit}};

template <typename P, typename E, size_t N>
P ToApi(const Choice<P, E> (&table)[N], E value) {
  for (const auto& c : table)
    if (c.engine == value) return c.api;
  return P{};  // unreachable while every table lists every engine value
}

// A value a client may have sent as a bare number (proto3 enums are open): one the schema does not know fails
// the request, naming the field and the values it takes.
template <typename P, typename E, size_t N>
Status FromApi(const Choice<P, E> (&table)[N], int value, const char* field, E* out) {
  if (value == 0) return Status::Ok();
  for (const auto& c : table)
    if (static_cast<int>(c.api) == value) {
      *out = c.engine;
      return Status::Ok();
    }
  return InvalidArgument(std::string("job field '") + field + "' has no value " + std::to_string(value) +
                         " (it takes " + v1::EnumShortNameList(google::protobuf::GetEnumDescriptor<P>()) + ")");
}

}  // namespace

v1::JobState StateToProto(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return v1::QUEUED;
    case JobState::kPreparing:
      return v1::PREPARING;
    case JobState::kRunning:
      return v1::RUNNING;
    case JobState::kSucceeded:
      return v1::SUCCEEDED;
    case JobState::kFailed:
      return v1::FAILED;
    case JobState::kCancelled:
      return v1::CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

StatusOr<JobState> StateFromProto(v1::JobState s) {
  for (JobState j : {JobState::kQueued, JobState::kPreparing, JobState::kRunning, JobState::kSucceeded,
                     JobState::kFailed, JobState::kCancelled})
    if (StateToProto(j) == s) return j;
  return DataLoss("no job state " + std::to_string(static_cast<int>(s)));
}

void SpecToProto(const std::string& name, const TrainingJobSpec& s, v1::JobSpec* p) {
  p->set_name(name);
  p->set_model_dir(s.model_dir);
  p->set_dataset(s.dataset_path);
  p->set_output_dir(s.output_dir);
  p->set_steps(s.steps);
  p->set_epochs(s.epochs);
  p->set_batch_size(s.batch_size);
  p->set_micro_batch_size(s.micro_batch_size);
  p->set_seq_len(s.seq_len);
  p->set_allow_seq_len_beyond_model(s.allow_seq_len_beyond_model);
  p->set_lr(s.lr);
  p->set_lr_schedule(ToApi(kLrSchedules, s.lr_schedule));
  p->set_warmup_steps(s.warmup_steps);
  p->set_weight_decay(s.weight_decay);
  p->set_max_grad_norm(s.max_grad_norm);
  p->set_adam_beta1(s.adam_beta1);
  p->set_adam_beta2(s.adam_beta2);
  p->set_adam_eps(s.adam_eps);
  p->set_seed(s.seed);
  p->set_dataset_format(ToApi(kDatasetFormats, s.dataset_format));
  p->set_chat_template(ToApi(kChatTemplates, s.chat_template));
  p->set_train_on(ToApi(kTrainOn, s.train_on));
  p->set_sequence_mode(ToApi(kSequenceModes, s.sequence_mode));
  p->set_bad_lines(ToApi(kBadLines, s.bad_lines));
  p->set_eval_fraction(s.eval_fraction);
  p->set_device(ToApi(kDevices, s.device));
  p->set_compute_dtype(ToApi(kComputeDtypes, s.compute_dtype));
  if (s.gpu_budget_bytes > 0) p->set_gpu_budget_bytes(s.gpu_budget_bytes);  // 0: left to the daemon
  p->set_window(s.window);
  p->set_activation_placement(ToApi(kPlacements, s.activation_placement));
  p->set_log_every(s.log_every);
  p->set_checkpoint_every(s.checkpoint_every);
  p->set_export_dtype(ToApi(kExportDtypes, s.export_dtype));
  p->set_nvme_state(ToApi(kNvmeStates, s.nvme_state));
  if (s.nvme_layers != -1) p->set_nvme_layers(s.nvme_layers);
  p->set_optimizer(ToApi(kOptimizers, s.optimizer));
  p->set_adapter(ToApi(kAdapters, s.adapter));
  if (s.adapter != AdapterMethod::kNone) {  // the LoRA settings as the job uses them, defaults included
    p->set_lora_r(s.lora.r);
    p->set_lora_alpha(s.lora.alpha);
    p->set_lora_dropout(s.lora.dropout);
    std::string targets;
    for (const auto& t : s.lora.target_modules) targets += (targets.empty() ? "" : ",") + t;
    p->set_lora_target_modules(targets);
    p->set_adapter_export(ToApi(kAdapterExports, s.adapter_export));
  }
}

StatusOr<TrainingJobSpec> SpecFromProto(const v1::JobSpec& p) {
  TrainingJobSpec s;
  s.model_dir = p.model_dir();
  s.dataset_path = p.dataset();
  s.output_dir = p.output_dir();
  if (p.steps() != 0) s.steps = p.steps();
  if (p.has_epochs()) s.epochs = p.epochs();
  if (p.has_batch_size()) s.batch_size = p.batch_size();
  if (p.micro_batch_size() != 0) s.micro_batch_size = p.micro_batch_size();
  if (p.has_seq_len()) s.seq_len = p.seq_len();
  if (p.has_lr()) s.lr = p.lr();
  SLIDE_RETURN_IF_ERROR(FromApi(kLrSchedules, p.lr_schedule(), "lr_schedule", &s.lr_schedule));
  if (p.warmup_steps() != 0) s.warmup_steps = p.warmup_steps();
  if (p.weight_decay() != 0) s.weight_decay = p.weight_decay();
  if (p.has_max_grad_norm()) s.max_grad_norm = p.max_grad_norm();
  s.seed = p.seed();
  if (p.has_adam_beta1()) s.adam_beta1 = p.adam_beta1();
  if (p.has_adam_beta2()) s.adam_beta2 = p.adam_beta2();
  if (p.has_adam_eps()) s.adam_eps = p.adam_eps();
  if (p.has_log_every()) s.log_every = p.log_every();
  SLIDE_RETURN_IF_ERROR(FromApi(kDatasetFormats, p.dataset_format(), "dataset_format", &s.dataset_format));
  SLIDE_RETURN_IF_ERROR(FromApi(kChatTemplates, p.chat_template(), "chat_template", &s.chat_template));
  SLIDE_RETURN_IF_ERROR(FromApi(kTrainOn, p.train_on(), "train_on", &s.train_on));
  SLIDE_RETURN_IF_ERROR(FromApi(kSequenceModes, p.sequence_mode(), "sequence_mode", &s.sequence_mode));
  SLIDE_RETURN_IF_ERROR(FromApi(kBadLines, p.bad_lines(), "bad_lines", &s.bad_lines));
  s.eval_fraction = p.eval_fraction();
  SLIDE_RETURN_IF_ERROR(FromApi(kDevices, p.device(), "device", &s.device));
  SLIDE_RETURN_IF_ERROR(FromApi(kComputeDtypes, p.compute_dtype(), "compute_dtype", &s.compute_dtype));
  if (p.has_gpu_budget_bytes()) s.gpu_budget_bytes = p.gpu_budget_bytes();
  s.window = p.window();
  SLIDE_RETURN_IF_ERROR(
      FromApi(kPlacements, p.activation_placement(), "activation_placement", &s.activation_placement));
  s.checkpoint_every = p.checkpoint_every();
  SLIDE_RETURN_IF_ERROR(FromApi(kExportDtypes, p.export_dtype(), "export_dtype", &s.export_dtype));
  s.allow_seq_len_beyond_model = p.allow_seq_len_beyond_model();
  SLIDE_RETURN_IF_ERROR(FromApi(kNvmeStates, p.nvme_state(), "nvme_state", &s.nvme_state));
  if (p.has_nvme_layers()) s.nvme_layers = p.nvme_layers();
  SLIDE_RETURN_IF_ERROR(FromApi(kOptimizers, p.optimizer(), "optimizer", &s.optimizer));
  SLIDE_RETURN_IF_ERROR(FromApi(kAdapters, p.adapter(), "adapter", &s.adapter));
  SLIDE_RETURN_IF_ERROR(FromApi(kAdapterExports, p.adapter_export(), "adapter_export", &s.adapter_export));
  if (p.has_lora_r()) s.lora.r = p.lora_r();
  if (p.has_lora_alpha()) s.lora.alpha = p.lora_alpha();
  s.lora.dropout = p.lora_dropout();
  if (!p.lora_target_modules().empty()) {
    s.lora.target_modules.clear();
    const std::string& t = p.lora_target_modules();
    for (size_t b = 0; b <= t.size();) {
      const size_t e = std::min(t.find(',', b), t.size());
      std::string name = t.substr(b, e - b);
      name.erase(0, name.find_first_not_of(' '));
      name.erase(name.find_last_not_of(' ') + 1);
      if (name.empty()) return InvalidArgument("job field 'lora_target_modules' has an empty name in '" + t + "'");
      s.lora.target_modules.push_back(name);
      b = e + 1;
    }
  }
  const bool lora_fields = p.has_lora_r() || p.has_lora_alpha() || p.lora_dropout() != 0 ||
                           !p.lora_target_modules().empty() || p.adapter_export() != v1::ADAPTER_EXPORT_UNSPECIFIED;
  if (lora_fields && !UsesAdapter(s.adapter))
    return InvalidArgument("job fields lora_* and adapter_export need adapter: lora or qlora");
  return s;
}

void JobToProto(const JobRecord& r, v1::Job* out) {
  out->set_id(r.id);
  SpecToProto(r.name, r.spec, out->mutable_spec());
  out->set_state(StateToProto(r.state));
  out->set_step(r.step);
  out->set_total_steps(r.total_steps);
  out->set_trainable_params(r.trainable_params);
  out->set_model_params(r.model_params);
  out->set_loss(r.loss);
  out->set_eval_loss(r.eval_loss);
  out->set_error(r.error);
  out->set_export_dir(r.export_dir);
  out->set_created_unix_ms(r.created_unix_ms);
  out->set_finished_unix_ms(r.finished_unix_ms);
  out->set_interrupted_runs(static_cast<int32_t>(r.interrupted_runs));
  out->set_interrupted_at_step(r.interrupted_at_step);
}

StatusOr<JobRecord> JobFromProto(const v1::Job& j) {
  if (j.id().empty()) return DataLoss("a job without an id");
  JobRecord r;
  r.id = j.id();
  r.name = j.spec().name();
  SLIDE_ASSIGN_OR_RETURN(r.spec, SpecFromProto(j.spec()));
  SLIDE_ASSIGN_OR_RETURN(r.state, StateFromProto(j.state()));
  r.step = j.step();
  r.total_steps = j.total_steps();
  r.trainable_params = j.trainable_params();
  r.model_params = j.model_params();
  r.loss = j.loss();
  r.eval_loss = j.eval_loss();
  r.error = j.error();
  r.export_dir = j.export_dir();
  r.created_unix_ms = j.created_unix_ms();
  r.finished_unix_ms = j.finished_unix_ms();
  r.interrupted_runs = j.interrupted_runs();
  r.interrupted_at_step = j.interrupted_at_step();
  return r;
}

void MetricsToProto(const TrainingStepEvent& s, bool replayed, v1::StepMetrics* m) {
  m->set_step(s.step);
  m->set_total_steps(s.total_steps);
  m->set_trainable_params(s.trainable_params);
  m->set_model_params(s.model_params);
  m->set_loss(s.loss);
  m->set_lr(s.lr);
  m->set_grad_norm(s.grad_norm);
  m->set_tokens_per_second(s.tokens_per_second);
  m->set_model_tflops(s.model_tflops);
  m->set_step_seconds(s.step_seconds);
  m->set_compute_seconds(s.compute_seconds);
  m->set_h2d_seconds(s.h2d_seconds);
  m->set_d2h_seconds(s.d2h_seconds);
  m->set_cpu_update_seconds(s.cpu_update_seconds);
  m->set_update_wait_seconds(s.update_wait_seconds);
  m->set_weights_first(s.weights_first);
  m->set_overlap_ratio(s.overlap_ratio);
  m->set_bounded_by(s.bounded_by);
  m->set_device_bytes(s.device_bytes);
  m->set_host_bytes(s.host_bytes);
  m->set_pinned_bytes(s.pinned_bytes);
  m->set_nvme_wait_seconds(s.nvme_wait_seconds);
  m->set_nvme_read_bytes(s.nvme_read_bytes);
  m->set_nvme_written_bytes(s.nvme_written_bytes);
  m->set_nvme_backend(s.nvme_backend);
  m->set_replayed(replayed);
}

TrainingStepEvent MetricsFromProto(const v1::StepMetrics& m) {
  TrainingStepEvent s;
  s.step = m.step();
  s.total_steps = m.total_steps();
  s.trainable_params = m.trainable_params();
  s.model_params = m.model_params();
  s.loss = m.loss();
  s.lr = m.lr();
  s.grad_norm = m.grad_norm();
  s.tokens_per_second = m.tokens_per_second();
  s.model_tflops = m.model_tflops();
  s.step_seconds = m.step_seconds();
  s.compute_seconds = m.compute_seconds();
  s.h2d_seconds = m.h2d_seconds();
  s.d2h_seconds = m.d2h_seconds();
  s.cpu_update_seconds = m.cpu_update_seconds();
  s.update_wait_seconds = m.update_wait_seconds();
  s.weights_first = m.weights_first();
  s.overlap_ratio = m.overlap_ratio();
  s.bounded_by = m.bounded_by();
  s.device_bytes = m.device_bytes();
  s.host_bytes = m.host_bytes();
  s.pinned_bytes = m.pinned_bytes();
  s.nvme_wait_seconds = m.nvme_wait_seconds();
  s.nvme_read_bytes = m.nvme_read_bytes();
  s.nvme_written_bytes = m.nvme_written_bytes();
  s.nvme_backend = m.nvme_backend();
  return s;
}

void EventToProto(const JobEventRecord& e, v1::JobEvent* out) {
  out->set_seq(e.seq);
  switch (e.kind) {
    case JobEventRecord::Kind::kState:
      out->set_state(StateToProto(e.state));
      break;
    case JobEventRecord::Kind::kLog:
      out->set_log(e.log);
      break;
    case JobEventRecord::Kind::kMetrics:
      MetricsToProto(e.metrics, e.replayed, out->mutable_metrics());
      break;
  }
}

StatusOr<JobEventRecord> EventFromProto(const v1::JobEvent& e) {
  JobEventRecord r;
  r.seq = e.seq();
  switch (e.kind_case()) {
    case v1::JobEvent::kMetrics:
      r.kind = JobEventRecord::Kind::kMetrics;
      r.metrics = MetricsFromProto(e.metrics());
      r.replayed = e.metrics().replayed();
      break;
    case v1::JobEvent::kState: {
      r.kind = JobEventRecord::Kind::kState;
      SLIDE_ASSIGN_OR_RETURN(r.state, StateFromProto(e.state()));
      break;
    }
    case v1::JobEvent::kLog:
      r.kind = JobEventRecord::Kind::kLog;
      r.log = e.log();
      break;
    default:
      return DataLoss("an event without metrics, state or log");
  }
  return r;
}

}  // namespace slide
