// The engine as the daemon sees it: the one header server/ includes from engine/ besides the job's plain structs
// (runtime/training_job.h). Plan a job at submission, run it on the engine thread, tell where an interrupted job
// resumes, clean what a killed daemon left, and describe the machine. A fake implements it in the job manager's
// tests (tests/support/fake_engine.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/common/status.h"
#include "engine/runtime/training_job.h"

namespace slide {

struct EngineDescription {
  std::string device;                 // e.g. "cuda:0 NVIDIA H100 (79.1 GiB)" or "cpu (16 threads, no CUDA device)"
  int64_t device_total_bytes = 0;     // 0 on the CPU
  int64_t device_reserved_bytes = 0;  // what the caching allocator holds now
  int64_t host_resident_bytes = 0;    // this process's resident memory now
  int64_t host_budget_bytes = 0;      // the host memory jobs are planned against (the machine's)
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Validates the spec against its environment, checks its files and plans memory (no weights loaded): the plan
  // as text, or the error a submission should get (RESOURCE_EXHAUSTED with the numbers when it cannot fit).
  virtual StatusOr<std::string> Plan(const TrainingJobSpec& spec, const JobEnvironment& env) = 0;
  // Runs the job to its end (see RunTrainingJob): `cancel` and `suspend` are read at step boundaries and while it
  // prepares. Never throws.
  virtual StatusOr<TrainingResult> Run(const TrainingJobSpec& spec, const JobEnvironment& env,
                                       const TrainingCallbacks& callbacks, const std::atomic<bool>* cancel,
                                       const std::atomic<bool>* suspend) = 0;
  // The step a job with this checkpoint directory resumes from (0 without a checkpoint), or why it cannot be read.
  virtual StatusOr<int64_t> ResumeStep(const std::string& checkpoint_dir) = 0;
  // Removes the NVMe tier's files that a killed daemon's jobs left in `dir`; how many.
  virtual int RemoveStaleTierFiles(const std::string& dir) = 0;
  virtual EngineDescription Describe() = 0;
};

// The engine in this process: LibTorch, the sliding trainer, CUDA when present.
std::unique_ptr<Engine> MakeLocalEngine();

}  // namespace slide
