// Fakes behind the daemon's seams, for the job manager's tests in-process and without LibTorch:
//   FakeEngine    an Engine whose jobs take `steps` steps that wait on a gate (the test opens it), honour cancel
//                 and suspend at step boundaries, and end as the test scripted (success, an error);
//   MemoryStore   a JobStore in memory that can be slowed down (a checkpoint removal of 100 GB) or refuse writes.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/job_store.h"

namespace slide::testing {

class FakeEngine final : public Engine {
 public:
  struct Script {
    int64_t steps = 3;
    Status outcome;  // OK: SUCCEEDED
  };
  // By job name; a name with no script runs the default.
  std::map<std::string, Script> scripts;
  Status plan_status;                           // what Plan answers (OK: "plan")
  std::map<std::string, int64_t> resume_steps;  // checkpoint_dir -> step

  // Steps wait until the gate is open (Open(n): n more steps may run).
  void Open(int64_t n = 1 << 30) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      allowed_ += n;
    }
    cv_.notify_all();
  }
  std::vector<std::string> started() const {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  std::vector<JobEnvironment> environments() const {
    std::lock_guard<std::mutex> lock(mu_);
    return envs_;
  }

  StatusOr<std::string> Plan(const TrainingJobSpec& spec, const JobEnvironment&) override {
    if (!plan_status.ok()) return plan_status;
    return "plan for " + spec.model_dir;
  }
  StatusOr<TrainingResult> Run(const TrainingJobSpec& spec, const JobEnvironment& env, const TrainingCallbacks& cb,
                               const std::atomic<bool>* cancel, const std::atomic<bool>* suspend) override {
    Script script;
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_.push_back(spec.model_dir);
      envs_.push_back(env);
      if (auto it = scripts.find(spec.model_dir); it != scripts.end()) script = it->second;
    }
    TrainingResult result;
    for (int64_t step = 1; step <= script.steps; ++step) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        // The flags are the job manager's atomics (nothing notifies this cv when they change): look every 5 ms.
        for (int i = 0; i < 6000 && !(allowed_ > 0 || cancel->load() || suspend->load()); ++i)
          cv_.wait_for(lock, std::chrono::milliseconds(5));
        if (cancel->load()) return Status(StatusCode::kCancelled, "cancelled at step " + std::to_string(step - 1));
        if (suspend->load()) {
          result.suspended = true;
          return result;
        }
        --allowed_;
      }
      TrainingStepEvent e;
      e.step = step;
      e.total_steps = script.steps;
      e.loss = 1.0 / static_cast<double>(step);
      if (cb.on_step) cb.on_step(e);
      result.steps = step;
    }
    if (!script.outcome.ok()) return script.outcome;
    result.export_dir = spec.output_dir;
    return result;
  }
  StatusOr<int64_t> ResumeStep(const std::string& checkpoint_dir) override {
    auto it = resume_steps.find(checkpoint_dir);
    return it == resume_steps.end() ? 0 : it->second;
  }
  int RemoveStaleTierFiles(const std::string&) override { return 0; }
  EngineDescription Describe() override { return {.device = "fake"}; }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t allowed_ = 0;
  std::vector<std::string> started_;
  std::vector<JobEnvironment> envs_;
};

class MemoryStore final : public JobStore {
 public:
  std::chrono::milliseconds remove_delay{0};  // each RemoveCheckpoints takes this long
  std::atomic<bool> refuse_writes{false};     // SaveRecord / SaveFinalRecord fail (a full disk)
  std::atomic<int> removals{0};

  Status CreateJobDir(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!dirs_.insert(id).second) return FailedPrecondition("job directory '" + id + "' already exists");
    return Status::Ok();
  }
  Status SaveRecord(const JobRecord& record) override {
    if (refuse_writes) return FailedPrecondition("no space left on device");
    std::lock_guard<std::mutex> lock(mu_);
    records_[record.id] = record;
    return Status::Ok();
  }
  Status SaveFinalRecord(const JobRecord& record) override { return SaveRecord(record); }
  Status AppendEvent(const std::string& id, const JobEventRecord& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_[id].push_back(event);
    return Status::Ok();
  }
  Status RemoveCheckpoints(const std::string&) override {
    std::this_thread::sleep_for(remove_delay);
    ++removals;
    return Status::Ok();
  }
  std::string CheckpointDir(const std::string& id) const override { return "/ckpt/" + id; }
  std::vector<StoredJob> LoadAll(size_t, std::vector<std::string>*) const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<StoredJob> out;
    for (const auto& [id, r] : records_) {
      StoredJob j{r, {}};
      if (auto e = events_.find(id); e != events_.end()) j.events = e->second;
      out.push_back(j);
    }
    return out;
  }
  int64_t HighestJobNumber() const override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const auto& id : dirs_) n = std::max<int64_t>(n, std::stoll(id.substr(4)));
    return n;
  }
  JobRecord Record(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return records_.at(id);
  }
  void Put(const JobRecord& r) {
    std::lock_guard<std::mutex> lock(mu_);
    records_[r.id] = r;
    dirs_.insert(r.id);
  }

 private:
  mutable std::mutex mu_;
  std::set<std::string> dirs_;
  std::map<std::string, JobRecord> records_;
  std::map<std::string, std::vector<JobEventRecord>> events_;
};

}  // namespace slide::testing
