#include "server/job_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/common/files.h"

namespace slide {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TrainingJobSpec, model_dir, dataset_path, output_dir, steps, epochs,
                                                batch_size, micro_batch_size, seq_len, lr, lr_schedule, warmup_steps,
                                                weight_decay, max_grad_norm, adam_beta1, adam_beta2, adam_eps, seed,
                                                dataset_format, chat_template, sequence_mode, bad_lines, eval_fraction,
                                                device, compute_dtype, gpu_budget_bytes, window, activation_placement,
                                                log_every, checkpoint_dir, checkpoint_every)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TrainingStepEvent, step, total_steps, loss, lr, grad_norm,
                                                tokens_per_second, model_tflops, step_seconds, compute_seconds,
                                                h2d_seconds, d2h_seconds, cpu_update_seconds, bounded_by, device_bytes,
                                                host_bytes, pinned_bytes)

namespace {

StatusOr<JobState> StateFromName(const std::string& name) {
  for (JobState s : {JobState::kQueued, JobState::kPreparing, JobState::kRunning, JobState::kSucceeded,
                     JobState::kFailed, JobState::kCancelled})
    if (name == JobStateName(s)) return s;
  return DataLoss("unknown job state '" + name + "'");
}

nlohmann::json RecordToJson(const JobRecord& r) {
  return {{"id", r.id},
          {"name", r.name},
          {"spec", r.spec},
          {"state", JobStateName(r.state)},
          {"step", r.step},
          {"total_steps", r.total_steps},
          {"loss", r.loss},
          {"eval_loss", r.eval_loss},
          {"error", r.error},
          {"export_dir", r.export_dir},
          {"created_unix_ms", r.created_unix_ms},
          {"finished_unix_ms", r.finished_unix_ms}};
}

StatusOr<JobRecord> RecordFromJson(const nlohmann::json& j) {
  JobRecord r;
  r.id = j.at("id").get<std::string>();
  r.name = j.value("name", "");
  r.spec = j.at("spec").get<TrainingJobSpec>();
  SLIDE_ASSIGN_OR_RETURN(r.state, StateFromName(j.at("state").get<std::string>()));
  r.step = j.value("step", int64_t{0});
  r.total_steps = j.value("total_steps", int64_t{0});
  r.loss = j.value("loss", 0.0);
  r.eval_loss = j.value("eval_loss", -1.0);
  r.error = j.value("error", "");
  r.export_dir = j.value("export_dir", "");
  r.created_unix_ms = j.value("created_unix_ms", int64_t{0});
  r.finished_unix_ms = j.value("finished_unix_ms", int64_t{0});
  return r;
}

nlohmann::json EventToJson(const JobEventRecord& e) {
  nlohmann::json j = {{"seq", e.seq}};
  switch (e.kind) {
    case JobEventRecord::Kind::kMetrics:
      j["metrics"] = e.metrics;
      break;
    case JobEventRecord::Kind::kState:
      j["state"] = JobStateName(e.state);
      break;
    case JobEventRecord::Kind::kLog:
      j["log"] = e.log;
      break;
  }
  return j;
}

StatusOr<JobEventRecord> EventFromJson(const nlohmann::json& j) {
  JobEventRecord e;
  e.seq = j.at("seq").get<int64_t>();
  if (j.contains("metrics")) {
    e.kind = JobEventRecord::Kind::kMetrics;
    e.metrics = j.at("metrics").get<TrainingStepEvent>();
  } else if (j.contains("state")) {
    e.kind = JobEventRecord::Kind::kState;
    SLIDE_ASSIGN_OR_RETURN(e.state, StateFromName(j.at("state").get<std::string>()));
  } else {
    e.kind = JobEventRecord::Kind::kLog;
    e.log = j.at("log").get<std::string>();
  }
  return e;
}

}  // namespace

Status JobStore::Init() {
  SLIDE_RETURN_IF_ERROR(MakeDirs(dir_ + "/jobs"));
  // Fail now, not at the first job, when the directory is not writable.
  return WriteFileAtomic(dir_ + "/.writable", "ok\n", /*durable=*/false);
}

Status JobStore::SaveRecord(const JobRecord& record, bool durable) {
  SLIDE_RETURN_IF_ERROR(MakeDirs(JobDir(record.id)));
  return WriteFileAtomic(JobDir(record.id) + "/record.json", RecordToJson(record).dump(2) + "\n", durable);
}

Status JobStore::AppendEvent(const std::string& id, const JobEventRecord& event) {
  const std::string path = JobDir(id) + "/events.jsonl";
  const std::string line = EventToJson(event).dump() + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return FailedPrecondition("cannot append to '" + path + "': " + std::strerror(errno));
  // One write of the whole line: a killed process leaves at most the last line torn.
  const ssize_t n = ::write(fd, line.data(), line.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) return FailedPrecondition("cannot append to '" + path + "'");
  return Status::Ok();
}

std::vector<StoredJob> JobStore::LoadAll(size_t max_events, std::vector<std::string>* problems) const {
  std::vector<std::string> ids;
  if (DIR* d = ::opendir((dir_ + "/jobs").c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") ids.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<StoredJob> out;
  for (const auto& id : ids) {
    const std::string record_path = JobDir(id) + "/record.json";
    auto text = ReadFileToString(record_path);
    if (!text.ok()) {
      problems->push_back(text.status().message());
      continue;
    }
    StoredJob job;
    try {
      auto r = RecordFromJson(nlohmann::json::parse(text.value()));
      if (!r.ok()) {
        problems->push_back(record_path + ": " + r.status().message());
        continue;
      }
      job.record = std::move(r).value();
    } catch (const nlohmann::json::exception& e) {
      problems->push_back(record_path + ": " + e.what());
      continue;
    }
    if (job.record.id != id) {
      problems->push_back(record_path + ": holds job '" + job.record.id + "'");
      continue;
    }
    std::deque<JobEventRecord> tail;
    std::ifstream events(JobDir(id) + "/events.jsonl");
    std::string line;
    int64_t line_no = 0;
    while (std::getline(events, line)) {
      ++line_no;
      try {
        auto e = EventFromJson(nlohmann::json::parse(line));
        if (!e.ok()) throw std::runtime_error(e.status().message());
        tail.push_back(std::move(e).value());
        if (tail.size() > max_events) tail.pop_front();
      } catch (const std::exception& e) {  // a torn last line after kill -9; anything else is reported
        if (events.peek() != EOF)
          problems->push_back(JobDir(id) + "/events.jsonl:" + std::to_string(line_no) + ": " + e.what());
      }
    }
    job.events.assign(tail.begin(), tail.end());
    out.push_back(std::move(job));
  }
  return out;
}

}  // namespace slide
