#include "server/job_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/common/files.h"
#include "server/log.h"

namespace slide {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TrainingJobSpec, model_dir, dataset_path, output_dir, steps, epochs,
                                                batch_size, micro_batch_size, seq_len, lr, lr_schedule, warmup_steps,
                                                weight_decay, max_grad_norm, adam_beta1, adam_beta2, adam_eps, seed,
                                                dataset_format, chat_template, sequence_mode, bad_lines, eval_fraction,
                                                device, compute_dtype, gpu_budget_bytes, window, activation_placement,
                                                log_every, checkpoint_dir, checkpoint_every, export_dtype,
                                                allow_seq_len_beyond_model, nvme_state)

namespace {

// nlohmann writes NaN and infinities as null (a diverged job's loss): read null back as NaN.
double Number(const nlohmann::json& j, const char* key, double fallback) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
}

// Text from the outside world (error messages quoting file bytes) may not be valid UTF-8: replace, never throw.
std::string Dump(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void to_json(nlohmann::json& j, const TrainingStepEvent& e) {
  j = {{"step", e.step},
       {"total_steps", e.total_steps},
       {"loss", e.loss},
       {"lr", e.lr},
       {"grad_norm", e.grad_norm},
       {"tokens_per_second", e.tokens_per_second},
       {"model_tflops", e.model_tflops},
       {"step_seconds", e.step_seconds},
       {"compute_seconds", e.compute_seconds},
       {"h2d_seconds", e.h2d_seconds},
       {"d2h_seconds", e.d2h_seconds},
       {"cpu_update_seconds", e.cpu_update_seconds},
       {"update_wait_seconds", e.update_wait_seconds},
       {"overlap_ratio", e.overlap_ratio},
       {"bounded_by", e.bounded_by},
       {"device_bytes", e.device_bytes},
       {"host_bytes", e.host_bytes},
       {"pinned_bytes", e.pinned_bytes},
       {"nvme_wait_seconds", e.nvme_wait_seconds},
       {"nvme_read_bytes", e.nvme_read_bytes},
       {"nvme_written_bytes", e.nvme_written_bytes},
       {"nvme_backend", e.nvme_backend}};
}

void from_json(const nlohmann::json& j, TrainingStepEvent& e) {
  e.step = j.value("step", int64_t{0});
  e.total_steps = j.value("total_steps", int64_t{0});
  e.loss = Number(j, "loss", 0);
  e.lr = Number(j, "lr", 0);
  e.grad_norm = Number(j, "grad_norm", 0);
  e.tokens_per_second = Number(j, "tokens_per_second", 0);
  e.model_tflops = Number(j, "model_tflops", 0);
  e.step_seconds = Number(j, "step_seconds", 0);
  e.compute_seconds = Number(j, "compute_seconds", 0);
  e.h2d_seconds = Number(j, "h2d_seconds", 0);
  e.d2h_seconds = Number(j, "d2h_seconds", 0);
  e.cpu_update_seconds = Number(j, "cpu_update_seconds", 0);
  e.update_wait_seconds = Number(j, "update_wait_seconds", 0);
  e.overlap_ratio = Number(j, "overlap_ratio", 0);
  e.bounded_by = j.value("bounded_by", "");
  e.device_bytes = j.value("device_bytes", int64_t{0});
  e.host_bytes = j.value("host_bytes", int64_t{0});
  e.pinned_bytes = j.value("pinned_bytes", int64_t{0});
  e.nvme_wait_seconds = Number(j, "nvme_wait_seconds", 0);
  e.nvme_read_bytes = j.value("nvme_read_bytes", int64_t{0});
  e.nvme_written_bytes = j.value("nvme_written_bytes", int64_t{0});
  e.nvme_backend = j.value("nvme_backend", "");
}

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
  r.loss = Number(j, "loss", 0.0);
  r.eval_loss = Number(j, "eval_loss", -1.0);
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
      if (e.replayed) j["replayed"] = true;
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
    e.replayed = j.value("replayed", false);
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
  return WriteFileAtomic(dir_ + "/.writable", "ok\n");
}

Status JobStore::SaveRecord(const JobRecord& record) {
  SLIDE_RETURN_IF_ERROR(MakeDirs(JobDir(record.id)));
  // Dump replaces invalid UTF-8 and cannot throw on content; nothing else here throws.
  return WriteFileAtomic(JobDir(record.id) + "/record.json", Dump(RecordToJson(record), 2) + "\n");
}

Status JobStore::AppendEvent(const std::string& id, const JobEventRecord& event) {
  const std::string path = JobDir(id) + "/events.jsonl";
  const std::string line = Dump(EventToJson(event), -1) + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return FailedPrecondition("cannot append to '" + path + "': " + std::strerror(errno));
  // One write of the whole line: a killed process leaves at most the last line torn.
  const ssize_t n = ::write(fd, line.data(), line.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) return FailedPrecondition("cannot append to '" + path + "'");
  return Status::Ok();
}

// kill -9 during an append can leave the last line without its newline: cut it off, so the next append does not
// continue it.
void JobStore::TrimTornLastLine(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok() || text.value().empty() || text.value().back() == '\n') return;
  const size_t keep = text.value().find_last_of('\n');
  if (::truncate(path.c_str(), keep == std::string::npos ? 0 : static_cast<off_t>(keep + 1)) != 0)
    LogError("cannot trim '" + path + "': " + std::strerror(errno));
}

int64_t JobStore::HighestJobNumber() const {
  int64_t highest = 0;
  if (DIR* d = ::opendir((dir_ + "/jobs").c_str())) {
    while (const dirent* e = ::readdir(d)) {
      long long n = 0;
      if (std::sscanf(e->d_name, "job-%lld", &n) == 1) highest = std::max<int64_t>(highest, n);
    }
    ::closedir(d);
  }
  return highest;
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
    const std::string events_path = JobDir(id) + "/events.jsonl";
    TrimTornLastLine(events_path);
    std::ifstream events(events_path);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(events, line)) {
      ++line_no;
      try {
        auto e = EventFromJson(nlohmann::json::parse(line));
        if (!e.ok()) throw std::runtime_error(e.status().message());
        tail.push_back(std::move(e).value());
        if (tail.size() > max_events) tail.pop_front();
      } catch (const std::exception& e) {  // a torn last line was trimmed above: this one is damaged
        problems->push_back(events_path + ":" + std::to_string(line_no) + ": " + e.what());
      }
    }
    job.events.assign(tail.begin(), tail.end());
    // Progress is not in record.json between state changes: the newest metrics event has it.
    for (auto e = job.events.rbegin(); e != job.events.rend(); ++e)
      if (e->kind == JobEventRecord::Kind::kMetrics) {
        job.record.step = e->metrics.step;
        job.record.total_steps = e->metrics.total_steps;
        job.record.loss = e->metrics.loss;
        break;
      }
    out.push_back(std::move(job));
  }
  return out;
}

}  // namespace slide
