#include "engine/runtime/training_job_checks.h"

#include <cmath>

namespace slide {

int64_t MicroBatchSize(const TrainingJobSpec& s) { return s.micro_batch_size == 0 ? s.batch_size : s.micro_batch_size; }

Status Field(bool ok, const std::string& field, const std::string& what) {
  return ok ? Status::Ok() : InvalidArgument("job field '" + field + "' " + what);
}

Status InRange(int64_t value, int64_t lo, int64_t hi, const std::string& field, const std::string& note) {
  return Field(
      value >= lo && value <= hi, field,
      "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + (note.empty() ? "" : " " + note));
}

const char* AdapterMethodName(AdapterMethod m) {
  switch (m) {
    case AdapterMethod::kNone:
      return "none";
    case AdapterMethod::kLora:
      return "lora";
    case AdapterMethod::kQLora:
      return "qlora";
  }
  return "?";
}

Status ValidateTrainingJobSpec(const TrainingJobSpec& s) {
  SLIDE_RETURN_IF_ERROR(Field(!s.model_dir.empty(), "model_dir", "is required"));
  SLIDE_RETURN_IF_ERROR(Field(!s.dataset_path.empty(), "dataset", "is required"));
  SLIDE_RETURN_IF_ERROR(Field(!s.output_dir.empty(), "output_dir", "is required"));
  // Every size is bounded here, before anything is planned or allocated: with these bounds the planner's and
  // the data order's products (tokens x hidden x bytes, steps x batch, epochs x sequences) stay far inside int64.
  const JobSizeLimits lim;
  SLIDE_RETURN_IF_ERROR(InRange(s.steps, 0, lim.max_steps, "steps", "(0 = derive from epochs)"));
  SLIDE_RETURN_IF_ERROR(InRange(s.epochs, 1, lim.max_epochs, "epochs"));
  SLIDE_RETURN_IF_ERROR(InRange(s.batch_size, 1, lim.max_batch_size, "batch_size"));
  SLIDE_RETURN_IF_ERROR(Field(s.micro_batch_size >= 0 && s.micro_batch_size <= s.batch_size, "micro_batch_size",
                              "must be in [0, batch_size] (0 = batch_size)"));
  const int64_t micro = MicroBatchSize(s);
  SLIDE_RETURN_IF_ERROR(Field(micro >= 1 && s.batch_size % micro == 0, "micro_batch_size",
                              "must divide batch_size (" + std::to_string(s.batch_size) + ")"));
  SLIDE_RETURN_IF_ERROR(InRange(s.seq_len, 2, lim.max_seq_len, "seq_len"));
  // Both factors are bounded above (2^20 each), so the products cannot overflow.
  SLIDE_RETURN_IF_ERROR(Field(micro * s.seq_len <= lim.max_micro_batch_tokens, "micro_batch_size",
                              "x seq_len is " + std::to_string(micro * s.seq_len) + " tokens per forward; at most " +
                                  std::to_string(lim.max_micro_batch_tokens) + " (use a smaller micro_batch_size)"));
  SLIDE_RETURN_IF_ERROR(Field(s.batch_size * s.seq_len <= lim.max_step_tokens, "batch_size",
                              "x seq_len is " + std::to_string(s.batch_size * s.seq_len) +
                                  " tokens per step; at most " + std::to_string(lim.max_step_tokens)));
  SLIDE_RETURN_IF_ERROR(Field(std::isfinite(s.lr) && s.lr > 0 && s.lr < 1, "lr", "must be in (0, 1)"));
  for (const auto& [name, value] : {std::pair<const char*, double>{"weight_decay", s.weight_decay},
                                    {"max_grad_norm", s.max_grad_norm},
                                    {"adam_beta1", s.adam_beta1},
                                    {"adam_beta2", s.adam_beta2},
                                    {"adam_eps", s.adam_eps},
                                    {"eval_fraction", s.eval_fraction}})
    SLIDE_RETURN_IF_ERROR(Field(std::isfinite(value), name, "must be a finite number"));
  SLIDE_RETURN_IF_ERROR(InRange(s.warmup_steps, 0, lim.max_steps, "warmup_steps"));
  SLIDE_RETURN_IF_ERROR(Field(s.weight_decay >= 0 && s.weight_decay < 1, "weight_decay", "must be in [0, 1)"));
  SLIDE_RETURN_IF_ERROR(Field(s.max_grad_norm >= 0, "max_grad_norm", "must be >= 0 (0 disables clipping)"));
  SLIDE_RETURN_IF_ERROR(Field(s.adam_beta1 >= 0 && s.adam_beta1 < 1, "adam_beta1", "must be in [0, 1)"));
  SLIDE_RETURN_IF_ERROR(Field(s.adam_beta2 >= 0 && s.adam_beta2 < 1, "adam_beta2", "must be in [0, 1)"));
  SLIDE_RETURN_IF_ERROR(Field(s.adam_eps > 0, "adam_eps", "must be > 0"));
  SLIDE_RETURN_IF_ERROR(Field(s.eval_fraction >= 0 && s.eval_fraction < 1, "eval_fraction", "must be in [0, 1)"));
  SLIDE_RETURN_IF_ERROR(
      InRange(s.gpu_budget_bytes, 0, lim.max_gpu_budget_bytes, "gpu_budget_bytes", "(0 = the daemon's default)"));
  SLIDE_RETURN_IF_ERROR(InRange(s.window, 0, lim.max_layers, "window", "(0 = chosen by the planner)"));
  SLIDE_RETURN_IF_ERROR(InRange(s.log_every, 1, lim.max_steps, "log_every"));
  SLIDE_RETURN_IF_ERROR(
      InRange(s.checkpoint_every, 0, lim.max_steps, "checkpoint_every", "(0 = the daemon's default)"));
  SLIDE_RETURN_IF_ERROR(Field(s.nvme_layers >= -1 && s.nvme_layers <= lim.max_layers, "nvme_layers",
                              "must be >= 1 (the last N layers' state on the NVMe tier) or 0 (as few as fit)"));
  SLIDE_RETURN_IF_ERROR(Field(s.nvme_layers == -1 || s.nvme_state != TierMode::kNone, "nvme_layers",
                              "needs nvme_state (moments or moments_and_master)"));
  if (UsesAdapter(s.adapter)) {
    SLIDE_RETURN_IF_ERROR(InRange(s.lora.r, 1, int64_t{1} << 16, "lora_r"));
    SLIDE_RETURN_IF_ERROR(Field(std::isfinite(s.lora.alpha) && s.lora.alpha > 0, "lora_alpha", "must be > 0"));
    SLIDE_RETURN_IF_ERROR(Field(std::isfinite(s.lora.dropout) && s.lora.dropout >= 0 && s.lora.dropout < 1,
                                "lora_dropout", "must be in [0, 1)"));
    SLIDE_RETURN_IF_ERROR(Field(s.optimizer == OptimizerKind::kAdamW, "optimizer",
                                std::string("must be adamw with adapter ") + AdapterMethodName(s.adapter) +
                                    " (the adapters' state is small and on the device)"));
    SLIDE_RETURN_IF_ERROR(Field(s.nvme_state == TierMode::kNone, "nvme_state",
                                std::string("must be none with adapter ") + AdapterMethodName(s.adapter) +
                                    " (the frozen base has no optimizer state)"));
  }
  if (s.optimizer == OptimizerKind::kAdamW8bit && s.nvme_state == TierMode::kMomentsAndMaster)
    return InvalidArgument(
        "job fields 'optimizer' (adamw_8bit) and 'nvme_state' (moments_and_master) cannot be combined yet: with 8-bit "
        "moments the tier holds the moments only (nvme_state: moments)");
  return Status::Ok();
}

}  // namespace slide
