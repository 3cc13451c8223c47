#include "server/job_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>

#include "engine/common/files.h"
#include "proto/enum_short_names.h"
#include "server/job_proto.h"
#include "server/log.h"

namespace slide {

namespace {

// Records and events as proto JSON of the API's own messages (slide.v1.Job, slide.v1.JobEvent), field names as in
// slide.proto. Unknown fields are skipped on reading, so a newer daemon's files stay readable.
StatusOr<std::string> ToJson(const google::protobuf::Message& m, bool pretty) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = pretty;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  const auto st = google::protobuf::util::MessageToJsonString(m, &out, o);
  if (!st.ok()) return Internal("cannot write " + m.GetTypeName() + " as JSON: " + st.ToString());
  return out;
}

Status FromJson(const std::string& text, google::protobuf::Message* m) {
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  const auto st = google::protobuf::util::JsonStringToMessage(text, m, o);
  if (!st.ok()) return DataLoss(std::string(st.message()));
  return Status::Ok();
}

// Records written before the store kept slide.v1.Job (up to 3b5b7b6) had the job's name beside the spec, the
// dataset under the engine's name, dataset_path, and the choices as short names ("linear"); the proto reader skips
// all three, so they are taken from the text.
void AdoptLegacyNames(const std::string& text, v1::Job* job) {
  if (text.find("\"dataset_path\"") == std::string::npos) return;
  google::protobuf::Struct legacy;
  if (!google::protobuf::util::JsonStringToMessage(text, &legacy).ok()) return;
  const auto& top = legacy.fields();
  if (auto name = top.find("name"); name != top.end() && name->second.has_string_value() && job->spec().name().empty())
    job->mutable_spec()->set_name(name->second.string_value());
  auto spec = top.find("spec");
  if (spec == top.end() || !spec->second.has_struct_value()) return;
  const auto& fields = spec->second.struct_value().fields();
  if (auto d = fields.find("dataset_path");
      d != fields.end() && d->second.has_string_value() && job->spec().dataset().empty())
    job->mutable_spec()->set_dataset(d->second.string_value());
  v1::JobSpec* out = job->mutable_spec();
  const google::protobuf::Descriptor* schema = v1::JobSpec::descriptor();
  for (int i = 0; i < schema->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = schema->field(i);
    auto value = fields.find(f->name());
    if (f->enum_type() == nullptr || value == fields.end() || !value->second.has_string_value()) continue;
    if (const auto* v = v1::FindEnumValueByShortName(f->enum_type(), value->second.string_value()))
      out->GetReflection()->SetEnum(out, f, v);
  }
}

}  // namespace

namespace {
constexpr off_t kReserveBytes = 4 << 20;  // a final record is a few KiB: room for hundreds of them

// "job-N" with N a plain decimal in [1, kMaxJobNumber]; 0 for any other name.
int64_t JobNumber(const std::string& name) {
  if (name.rfind("job-", 0) != 0 || name.size() < 5 || name.size() > 4 + 12) return 0;
  int64_t n = 0;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    n = n * 10 + (name[i] - '0');
  }
  return n <= kMaxJobNumber ? n : 0;
}
}  // namespace

DirectoryJobStore::~DirectoryJobStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

Status DirectoryJobStore::Init() {
  SLIDE_RETURN_IF_ERROR(MakeDirs(dir_ + "/jobs"));
  // Records quote job specs (paths, names): the directory is the daemon user's alone.
  (void)::chmod(dir_.c_str(), 0700);
  const std::string lock_path = dir_ + "/lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return FailedPrecondition("cannot open '" + lock_path + "': " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {0};
    const ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (err == EWOULDBLOCK)
      return FailedPrecondition("state directory '" + dir_ + "' is in use by another slided (pid " +
                                (holder.empty() ? std::string("unknown") : holder) +
                                "); stop it or give this one another --state-dir");
    return FailedPrecondition("cannot lock '" + lock_path + "': " + std::strerror(err));
  }
  lock_fd_ = fd;
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    LogWarning("cannot write the pid into '" + lock_path + "': " + std::strerror(errno));
  // Fail now, not at the first job, when the directory is not writable.
  SLIDE_RETURN_IF_ERROR(WriteFileAtomic(dir_ + "/.writable", "ok\n"));
  KeepReserve();
  return Status::Ok();
}

void DirectoryJobStore::KeepReserve() {
  const std::string path = dir_ + "/reserve";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_size >= kReserveBytes) return;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  // Blocks really allocated (not a sparse file), so that deleting it frees them.
  const int err = ::posix_fallocate(fd, 0, kReserveBytes);
  ::close(fd);
  if (err != 0) {
    ::unlink(path.c_str());
    LogWarning("cannot set aside " + std::to_string(kReserveBytes) + " bytes in '" + dir_ +
               "' for final job records: " + std::strerror(err));
  }
}

Status DirectoryJobStore::CreateJobDir(const std::string& id) {
  if (::mkdir(JobDir(id).c_str(), 0700) != 0) {
    if (errno == EEXIST) return FailedPrecondition("job directory '" + JobDir(id) + "' already exists");
    return FailedPrecondition("cannot create '" + JobDir(id) + "': " + std::strerror(errno));
  }
  return Status::Ok();
}

Status DirectoryJobStore::SaveRecord(const JobRecord& record) {
  SLIDE_RETURN_IF_ERROR(MakeDirs(JobDir(record.id)));
  v1::Job job;
  JobToProto(record, &job);
  SLIDE_ASSIGN_OR_RETURN(std::string text, ToJson(job, /*pretty=*/true));
  return WriteFileAtomic(JobDir(record.id) + "/record.json", text);
}

Status DirectoryJobStore::SaveFinalRecord(const JobRecord& record) {
  Status st = SaveRecord(record);
  if (st.ok()) return st;
  // Most likely a full disk: give up the reserve and try once more.
  if (::unlink((dir_ + "/reserve").c_str()) == 0) {
    LogWarning("writing job " + record.id + "'s final record failed (" + st.message() +
               "); released the state directory's reserve to write it");
    st = SaveRecord(record);
  }
  if (st.ok()) KeepReserve();
  return st;
}

Status DirectoryJobStore::AppendEvent(const std::string& id, const JobEventRecord& event) {
  const std::string path = JobDir(id) + "/events.jsonl";
  v1::JobEvent proto;
  EventToProto(event, &proto);
  SLIDE_ASSIGN_OR_RETURN(std::string line, ToJson(proto, /*pretty=*/false));
  line += "\n";
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
void DirectoryJobStore::TrimTornLastLine(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok() || text.value().empty() || text.value().back() == '\n') return;
  const size_t keep = text.value().find_last_of('\n');
  if (::truncate(path.c_str(), keep == std::string::npos ? 0 : static_cast<off_t>(keep + 1)) != 0)
    LogError("cannot trim '" + path + "': " + std::strerror(errno));
}

Status DirectoryJobStore::RemoveCheckpoints(const std::string& id) { return RemoveTree(CheckpointDir(id)); }

int64_t DirectoryJobStore::HighestJobNumber() const {
  int64_t highest = 0;
  if (DIR* d = ::opendir((dir_ + "/jobs").c_str())) {
    while (const dirent* e = ::readdir(d)) highest = std::max(highest, JobNumber(e->d_name));
    ::closedir(d);
  }
  return highest;
}

std::vector<StoredJob> DirectoryJobStore::LoadAll(size_t max_events, std::vector<std::string>* problems) const {
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
    v1::Job proto;
    Status parsed = FromJson(text.value(), &proto);
    if (parsed.ok()) AdoptLegacyNames(text.value(), &proto);
    auto r = parsed.ok() ? JobFromProto(proto) : StatusOr<JobRecord>(parsed);
    if (!r.ok()) {
      problems->push_back(record_path + ": " + r.status().message());
      continue;
    }
    job.record = std::move(r).value();
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
      v1::JobEvent proto;
      Status parsed = FromJson(line, &proto);
      auto e = parsed.ok() ? EventFromProto(proto) : StatusOr<JobEventRecord>(parsed);
      if (!e.ok()) {  // a torn last line was trimmed above: this one is damaged
        problems->push_back(events_path + ":" + std::to_string(line_no) + ": " + e.status().message());
        continue;
      }
      tail.push_back(std::move(e).value());
      if (tail.size() > max_events) tail.pop_front();
    }
    job.events.assign(tail.begin(), tail.end());
    // Progress is not in record.json between state changes: the newest metrics event has it.
    for (auto e = job.events.rbegin(); e != job.events.rend(); ++e)
      if (e->kind == JobEventRecord::Kind::kMetrics) {
        job.record.step = e->metrics.step;
        job.record.total_steps = e->metrics.total_steps;
        job.record.trainable_params = e->metrics.trainable_params;
        job.record.model_params = e->metrics.model_params;
        job.record.loss = e->metrics.loss;
        break;
      }
    out.push_back(std::move(job));
  }
  return out;
}

}  // namespace slide
