#include "server/daemon_metrics.h"

namespace slide {
namespace {
prometheus::Gauge* Gauge(prometheus::Registry& r, const std::string& name, const std::string& help,
                         const prometheus::Labels& labels = {}) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}
prometheus::Counter* Counter(prometheus::Registry& r, const std::string& name, const std::string& help,
                             const prometheus::Labels& labels = {}) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}
}  // namespace

DaemonMetrics::DaemonMetrics(const std::string& version, int64_t gpu_budget_bytes, int64_t device_total_bytes,
                             int64_t host_budget_bytes)
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  Gauge(r, "slide_build_info", "Build of the running daemon (value 1)", {{"version", version}})->Set(1);
  steps_ = Counter(r, "slide_steps_total", "Optimizer steps completed by all jobs");
  tokens_ = Counter(r, "slide_tokens_total", "Training tokens processed by all jobs");
  job_step_ = Gauge(r, "slide_job_step", "Optimizer step of the running (or last) job");
  job_total_steps_ = Gauge(r, "slide_job_total_steps", "Total optimizer steps of the running (or last) job");
  job_trainable_params_ = Gauge(r, "slide_job_trainable_parameters",
                                "Parameters the running (or last) job trains: the model's, or its adapters'");
  job_model_params_ = Gauge(r, "slide_job_model_parameters", "Parameters of the running (or last) job's model");
  step_seconds_ = Gauge(r, "slide_step_seconds", "Wall time of the last optimizer step");
  tokens_per_second_ = Gauge(r, "slide_tokens_per_second", "Training throughput of the last step");
  tflops_ = Gauge(r, "slide_model_tflops", "Model TFLOPS (6*N*tokens per second) of the last step");
  loss_ = Gauge(r, "slide_loss", "Training loss of the last step");
  lr_ = Gauge(r, "slide_learning_rate", "Learning rate of the last step");
  grad_norm_ = Gauge(r, "slide_grad_norm", "Global gradient L2 norm of the last step (before clipping)");
  auto& busy = prometheus::BuildCounter()
                   .Name("slide_busy_seconds_total")
                   .Help("Busy time per resource over all steps: what bounds the step")
                   .Register(r);
  busy_compute_ = &busy.Add({{"resource", "gpu_compute"}});
  busy_h2d_ = &busy.Add({{"resource", "h2d"}});
  busy_d2h_ = &busy.Add({{"resource", "d2h"}});
  busy_update_ = &busy.Add({{"resource", "cpu_update"}});
  update_wait_ = Counter(r, "slide_update_wait_seconds_total",
                         "Time the engine waited on optimizer updates: the update time the overlap did not hide");
  weights_first_steps_ = Counter(r, "slide_weights_first_steps_total",
                                 "Steps whose optimizer updates went weights first (the engine's measured choice)");
  overlap_ratio_ =
      Gauge(r, "slide_overlap_ratio", "Step time / busiest resource of the last step (1 = all else hidden)");
  nvme_wait_ = Counter(r, "slide_nvme_wait_seconds_total",
                       "Time optimizer updates waited on the NVMe tier's disk (reads not in, write-backs pending)");
  auto& nvme_bytes = prometheus::BuildCounter()
                         .Name("slide_nvme_bytes_total")
                         .Help("Bytes the NVMe tier moved for optimizer updates")
                         .Register(r);
  nvme_read_ = &nvme_bytes.Add({{"direction", "read"}});
  nvme_written_ = &nvme_bytes.Add({{"direction", "write"}});
  nvme_backend_ = &prometheus::BuildGauge()
                       .Name("slide_nvme_backend")
                       .Help("The NVMe tier's I/O backend of the last step that used it (1), and any earlier one (0)")
                       .Register(r);
  auto& gpu = prometheus::BuildGauge().Name("slide_gpu_memory_bytes").Help("Device memory").Register(r);
  gpu_used_ = &gpu.Add({{"kind", "reserved"}});
  gpu_budget_ = &gpu.Add({{"kind", "budget"}});
  gpu_total_ = &gpu.Add({{"kind", "total"}});
  gpu_budget_->Set(static_cast<double>(gpu_budget_bytes));
  gpu_total_->Set(static_cast<double>(device_total_bytes));
  auto& host = prometheus::BuildGauge().Name("slide_host_memory_bytes").Help("Host memory of the daemon").Register(r);
  host_resident_ = &host.Add({{"kind", "resident"}});
  host_pinned_ = &host.Add({{"kind", "pinned"}});
  host.Add({{"kind", "budget"}}).Set(static_cast<double>(host_budget_bytes));  // what jobs are planned against
  auto& jobs = prometheus::BuildGauge().Name("slide_jobs").Help("Jobs by state").Register(r);
  for (JobState s : {JobState::kQueued, JobState::kPreparing, JobState::kRunning, JobState::kSucceeded,
                     JobState::kFailed, JobState::kCancelled})
    jobs_[s] = &jobs.Add({{"state", JobStateName(s)}});
  queue_ = Gauge(r, "slide_queue_length", "Jobs waiting for the engine");
}

StatusOr<int> DaemonMetrics::Serve(const std::string& listen) {
  http_ = std::make_unique<MetricsHttpServer>(registry_);
  return http_->Start(listen);
}

void DaemonMetrics::OnStep(const TrainingStepEvent& e, int64_t new_steps, int64_t tokens_per_step) {
  steps_->Increment(static_cast<double>(new_steps));
  tokens_->Increment(static_cast<double>(new_steps * tokens_per_step));
  job_step_->Set(static_cast<double>(e.step));
  job_total_steps_->Set(static_cast<double>(e.total_steps));
  job_trainable_params_->Set(static_cast<double>(e.trainable_params));
  job_model_params_->Set(static_cast<double>(e.model_params));
  step_seconds_->Set(e.step_seconds);
  tokens_per_second_->Set(e.tokens_per_second);
  tflops_->Set(e.model_tflops);
  loss_->Set(e.loss);
  lr_->Set(e.lr);
  grad_norm_->Set(e.grad_norm);
  busy_compute_->Increment(e.compute_seconds);
  busy_h2d_->Increment(e.h2d_seconds);
  busy_d2h_->Increment(e.d2h_seconds);
  busy_update_->Increment(e.cpu_update_seconds);
  update_wait_->Increment(e.update_wait_seconds);
  if (e.weights_first) weights_first_steps_->Increment();
  overlap_ratio_->Set(e.overlap_ratio);
  gpu_used_->Set(static_cast<double>(e.device_bytes));
  host_resident_->Set(static_cast<double>(e.host_bytes));
  host_pinned_->Set(static_cast<double>(e.pinned_bytes));
  if (!e.nvme_backend.empty()) {
    nvme_wait_->Increment(e.nvme_wait_seconds);
    nvme_read_->Increment(static_cast<double>(e.nvme_read_bytes));
    nvme_written_->Increment(static_cast<double>(e.nvme_written_bytes));
    nvme_backend_->Add({{"backend", e.nvme_backend}}).Set(1);
    for (const auto& [name, gauge] : nvme_backends_)
      if (name != e.nvme_backend) gauge->Set(0);
    nvme_backends_[e.nvme_backend] = &nvme_backend_->Add({{"backend", e.nvme_backend}});
  }
}

void DaemonMetrics::OnJobCounts(const std::map<JobState, int>& by_state, int queued) {
  for (auto& [state, gauge] : jobs_) {
    auto it = by_state.find(state);
    gauge->Set(it == by_state.end() ? 0 : it->second);
  }
  queue_->Set(queued);
}

}  // namespace slide
