// DaemonMetrics: the daemon's Prometheus metrics (DESIGN §6: slide_ prefix, base units, no per-step labels),
// served on its own port by MetricsHttpServer (see there why not prometheus-cpp's CivetWeb exposer). Updates are atomic
// stores from the thread that has the figure (the engine thread after a step, the job manager on state changes); a
// scrape never waits on the engine.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>

#include "server/job_types.h"
#include "server/metrics_http.h"

namespace slide {

class DaemonMetrics final : public JobObserver {
 public:
  // host_budget_bytes: the host memory jobs are planned against (EngineDescription::host_budget_bytes).
  DaemonMetrics(const std::string& version, int64_t gpu_budget_bytes, int64_t device_total_bytes,
                int64_t host_budget_bytes);

  // Binds the /metrics endpoint; returns the bound port (listen "HOST:0" picks one).
  StatusOr<int> Serve(const std::string& listen);

  void OnStep(const TrainingStepEvent& e, int64_t new_steps, int64_t tokens_per_step) override;
  void OnJobCounts(const std::map<JobState, int>& by_state, int queued) override;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsHttpServer> http_;
  prometheus::Counter *steps_, *tokens_;
  prometheus::Gauge *job_trainable_params_, *job_model_params_;
  prometheus::Gauge *job_step_, *job_total_steps_, *step_seconds_, *tokens_per_second_, *tflops_, *loss_, *lr_,
      *grad_norm_;
  prometheus::Counter *busy_compute_, *busy_h2d_, *busy_d2h_, *busy_update_, *update_wait_;
  prometheus::Counter* weights_first_steps_;
  prometheus::Gauge* overlap_ratio_;
  prometheus::Counter *nvme_wait_, *nvme_read_, *nvme_written_;
  prometheus::Family<prometheus::Gauge>* nvme_backend_;  // 1 for the backend of the last step's tier, 0 for others
  std::map<std::string, prometheus::Gauge*> nvme_backends_;
  prometheus::Gauge *gpu_used_, *gpu_budget_, *gpu_total_, *host_resident_, *host_pinned_;
  std::map<JobState, prometheus::Gauge*> jobs_;
  prometheus::Gauge* queue_;
};

}  // namespace slide
