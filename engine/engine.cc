#include "engine/engine.h"

#include "engine/io/nvme_store.h"
#include "engine/runtime/device_info.h"
#include "engine/runtime/training_checkpoint.h"

namespace slide {
namespace {

class LocalEngine final : public Engine {
 public:
  LocalEngine() : device_(DescribeDevice()) {}

  StatusOr<std::string> Plan(const TrainingJobSpec& spec, const JobEnvironment& env) override {
    return PlanTrainingJob(spec, env);
  }
  StatusOr<TrainingResult> Run(const TrainingJobSpec& spec, const JobEnvironment& env,
                               const TrainingCallbacks& callbacks, const std::atomic<bool>* cancel,
                               const std::atomic<bool>* suspend) override {
    return RunTrainingJob(spec, env, callbacks, cancel, suspend);
  }
  StatusOr<int64_t> ResumeStep(const std::string& checkpoint_dir) override {
    SLIDE_ASSIGN_OR_RETURN(auto info, ReadCheckpointInfo(checkpoint_dir));
    return info ? info->step : 0;
  }
  int RemoveStaleTierFiles(const std::string& dir) override { return RemoveStaleStoreFiles(dir); }
  EngineDescription Describe() override {
    EngineDescription d;
    d.device = device_.description;
    d.device_total_bytes = device_.total_bytes;
    d.device_reserved_bytes = ReadDeviceAllocatorStats().reserved_bytes;
    d.host_resident_bytes = ResidentHostBytes();
    d.host_budget_bytes = PhysicalHostBytes();
    return d;
  }

 private:
  const DeviceInfo device_;  // read once: the device does not change under a running daemon
};

}  // namespace

std::unique_ptr<Engine> MakeLocalEngine() { return std::make_unique<LocalEngine>(); }

}  // namespace slide
