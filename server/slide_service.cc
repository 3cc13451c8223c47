#include "server/slide_service.h"

#include <cctype>

#include "server/job_proto.h"

namespace slide {

namespace {
// gRPC sends a status message as metadata, refused past its 16 KiB limit ("Stream removed"): every message is
// bounded here too, whatever its source quoted.
constexpr size_t kMaxStatusMessageBytes = 4096;
}  // namespace

grpc::Status ToGrpc(const Status& status) {
  Status s = status;
  if (s.message().size() > kMaxStatusMessageBytes)
    s = Status(s.code(), s.message().substr(0, kMaxStatusMessageBytes - 64) + "... (" +
                             std::to_string(s.message().size()) + " bytes in all)");
  switch (s.code()) {
    case StatusCode::kOk:
      return grpc::Status::OK;
    case StatusCode::kInvalidArgument:
      return {grpc::StatusCode::INVALID_ARGUMENT, s.message()};
    case StatusCode::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, s.message()};
    case StatusCode::kResourceExhausted:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, s.message()};
    case StatusCode::kFailedPrecondition:
      return {grpc::StatusCode::FAILED_PRECONDITION, s.message()};
    case StatusCode::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, s.message()};
    case StatusCode::kUnauthenticated:
      return {grpc::StatusCode::UNAUTHENTICATED, s.message()};
    case StatusCode::kPermissionDenied:
      return {grpc::StatusCode::PERMISSION_DENIED, s.message()};
    case StatusCode::kCancelled:
      return {grpc::StatusCode::CANCELLED, s.message()};
    case StatusCode::kDataLoss:
      return {grpc::StatusCode::DATA_LOSS, s.message()};
    case StatusCode::kInternal:
      return {grpc::StatusCode::INTERNAL, s.message()};
  }
  return {grpc::StatusCode::UNKNOWN, s.message()};
}

grpc::Status SlideService::Authorize(grpc::ServerContext* ctx) const {
  if (options_.token.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return {grpc::StatusCode::UNAUTHENTICATED, "this daemon requires a bearer token"};
  // "Bearer TOKEN", the scheme case-insensitive (RFC 7235).
  const std::string got(it->second.data(), it->second.size());
  const size_t space = got.find(' ');
  std::string scheme = got.substr(0, space);
  for (char& ch : scheme) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (space == std::string::npos || scheme != "bearer")
    return {grpc::StatusCode::UNAUTHENTICATED, "the authorization header must be 'Bearer TOKEN'"};
  const std::string token = got.substr(space + 1);
  const std::string& want = options_.token;
  // Constant time in the token's content.
  unsigned diff = token.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(i < token.size() ? token[i] ^ want[i] : 1);
  if (diff != 0) return {grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token"};
  return grpc::Status::OK;
}

grpc::Status SlideService::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                     v1::SubmitJobResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  if (draining_) return {grpc::StatusCode::UNAVAILABLE, "the daemon is draining"};
  auto spec = SpecFromProto(req->spec());
  if (!spec.ok()) return ToGrpc(spec.status());
  auto r = jobs_.Submit(req->spec().name(), *spec);
  if (!r.ok()) return ToGrpc(r.status());
  JobToProto(r.value(), resp->mutable_job());
  return grpc::Status::OK;
}

grpc::Status SlideService::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::GetJobResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  auto r = jobs_.Get(req->id());
  if (!r.ok()) return ToGrpc(r.status());
  JobToProto(r.value(), resp->mutable_job());
  return grpc::Status::OK;
}

grpc::Status SlideService::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                    v1::ListJobsResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  std::optional<JobState> filter;
  if (req->state() != v1::JOB_STATE_UNSPECIFIED) {
    auto state = StateFromProto(req->state());
    if (!state.ok())
      return {grpc::StatusCode::INVALID_ARGUMENT, "state " + std::to_string(req->state()) + " is not a job state"};
    filter = state.value();
  }
  if (req->page_size() < 0) return {grpc::StatusCode::INVALID_ARGUMENT, "page_size must be >= 0"};
  const size_t page = req->page_size() == 0 ? 100 : static_cast<size_t>(req->page_size());
  // A page token is what an earlier answer gave: the decimal offset of the next job, nothing else ("+7", " 7",
  // "5abc" and "-1" are refused, not read as numbers).
  size_t start = 0;
  const std::string& token = req->page_token();
  if (!token.empty()) {
    if (token.size() > 12 || token.find_first_not_of("0123456789") != std::string::npos ||
        (token.size() > 1 && token[0] == '0'))
      return {grpc::StatusCode::INVALID_ARGUMENT, "bad page_token " + QuoteInput(token)};
    start = std::stoull(token);
  }
  auto all = jobs_.List(filter);
  for (size_t i = start; i < all.size() && i < start + page; ++i) JobToProto(all[i], resp->add_jobs());
  if (start + page < all.size()) resp->set_next_page_token(std::to_string(start + page));
  return grpc::Status::OK;
}

grpc::Status SlideService::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                     v1::CancelJobResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  auto r = jobs_.Cancel(req->id());
  if (!r.ok()) return ToGrpc(r.status());
  JobToProto(r.value(), resp->mutable_job());
  return grpc::Status::OK;
}

grpc::Status SlideService::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                    grpc::ServerWriter<v1::JobEvent>* writer) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  int64_t after = req->after_seq();
  while (!ctx->IsCancelled()) {
    bool final = false;
    auto events = jobs_.Events(req->id(), after, 200, &final);
    if (!events.ok()) return ToGrpc(events.status());
    for (const auto& e : events.value()) {
      v1::JobEvent out;
      EventToProto(e, &out);
      after = e.seq;
      if (e.kind == JobEventRecord::Kind::kMetrics && e.metrics.step < req->from_step()) continue;
      if (!writer->Write(out)) return grpc::Status::OK;  // the watcher left; the job goes on
    }
    if (final) return grpc::Status::OK;
    if (draining_ && events.value().empty()) return {grpc::StatusCode::UNAVAILABLE, "the daemon is draining"};
  }
  return grpc::Status::OK;
}

grpc::Status SlideService::GetServerStatus(grpc::ServerContext* ctx, const v1::GetServerStatusRequest*,
                                           v1::ServerStatus* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  const EngineDescription machine = engine_.Describe();
  resp->set_version(options_.version);
  resp->set_device(machine.device);
  resp->set_device_memory_bytes(machine.device_total_bytes);
  resp->set_queued_jobs(jobs_.queued());
  resp->set_running_job(jobs_.running());
  resp->set_draining(draining_);
  resp->set_device_reserved_bytes(machine.device_reserved_bytes);
  resp->set_host_resident_bytes(machine.host_resident_bytes);
  resp->set_gpu_budget_bytes(options_.gpu_budget_bytes);
  resp->set_state_dir(options_.state_dir);
  resp->set_jobs_total(jobs_.total());
  return grpc::Status::OK;
}

}  // namespace slide
