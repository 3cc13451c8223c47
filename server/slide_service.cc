#include "server/slide_service.h"

#include <cctype>

#include "engine/runtime/device_info.h"

namespace slide {
namespace {

v1::JobState ToProto(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return v1::QUEUED;
    case JobState::kPreparing:
      return v1::PREPARING;
    case JobState::kRunning:
      return v1::RUNNING;
    case JobState::kSucceeded:
      return v1::SUCCEEDED;
    case JobState::kFailed:
      return v1::FAILED;
    case JobState::kCancelled:
      return v1::CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

// The job's spec as it runs: every field, defaults filled in (the daemon's included), so GetJob and ListJobs
// show what the engine was given, not only what the request said.
void SpecToProto(const std::string& name, const TrainingJobSpec& s, v1::JobSpec* p) {
  p->set_name(name);
  p->set_model_dir(s.model_dir);
  p->set_dataset(s.dataset_path);
  p->set_output_dir(s.output_dir);
  p->set_steps(s.steps);
  p->set_epochs(s.epochs);
  p->set_batch_size(s.batch_size);
  p->set_micro_batch_size(s.micro_batch_size);
  p->set_seq_len(s.seq_len);
  p->set_allow_seq_len_beyond_model(s.allow_seq_len_beyond_model);
  p->set_lr(s.lr);
  p->set_lr_schedule(s.lr_schedule);
  p->set_warmup_steps(s.warmup_steps);
  p->set_weight_decay(s.weight_decay);
  p->set_max_grad_norm(s.max_grad_norm);
  p->set_adam_beta1(s.adam_beta1);
  p->set_adam_beta2(s.adam_beta2);
  p->set_adam_eps(s.adam_eps);
  p->set_seed(s.seed);
  p->set_dataset_format(s.dataset_format);
  p->set_chat_template(s.chat_template);
  p->set_sequence_mode(s.sequence_mode);
  p->set_bad_lines(s.bad_lines);
  p->set_eval_fraction(s.eval_fraction);
  p->set_device(s.device);
  p->set_compute_dtype(s.compute_dtype);
  p->set_gpu_budget_bytes(s.gpu_budget_bytes);
  p->set_window(s.window);
  p->set_activation_placement(s.activation_placement);
  p->set_log_every(s.log_every);
  p->set_checkpoint_every(s.checkpoint_every);
  p->set_export_dtype(s.export_dtype);
  p->set_nvme_state(s.nvme_state);
}

void FillJob(const JobRecord& r, v1::Job* out) {
  out->set_id(r.id);
  SpecToProto(r.name, r.spec, out->mutable_spec());
  out->set_state(ToProto(r.state));
  out->set_step(r.step);
  out->set_total_steps(r.total_steps);
  out->set_loss(r.loss);
  out->set_eval_loss(r.eval_loss);
  out->set_error(r.error);
  out->set_export_dir(r.export_dir);
  out->set_created_unix_ms(r.created_unix_ms);
  out->set_finished_unix_ms(r.finished_unix_ms);
}

}  // namespace

grpc::Status ToGrpc(const Status& s) {
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

TrainingJobSpec SpecFromProto(const v1::JobSpec& p) {
  TrainingJobSpec s;
  s.model_dir = p.model_dir();
  s.dataset_path = p.dataset();
  s.output_dir = p.output_dir();
  if (p.steps() != 0) s.steps = p.steps();
  if (p.has_epochs()) s.epochs = p.epochs();
  if (p.has_batch_size()) s.batch_size = p.batch_size();
  if (p.micro_batch_size() != 0) s.micro_batch_size = p.micro_batch_size();
  if (p.has_seq_len()) s.seq_len = p.seq_len();
  if (p.has_lr()) s.lr = p.lr();
  if (!p.lr_schedule().empty()) s.lr_schedule = p.lr_schedule();
  if (p.warmup_steps() != 0) s.warmup_steps = p.warmup_steps();
  if (p.weight_decay() != 0) s.weight_decay = p.weight_decay();
  if (p.has_max_grad_norm()) s.max_grad_norm = p.max_grad_norm();
  s.seed = p.seed();
  if (p.has_adam_beta1()) s.adam_beta1 = p.adam_beta1();
  if (p.has_adam_beta2()) s.adam_beta2 = p.adam_beta2();
  if (p.has_adam_eps()) s.adam_eps = p.adam_eps();
  if (p.has_log_every()) s.log_every = p.log_every();
  if (!p.dataset_format().empty()) s.dataset_format = p.dataset_format();
  if (!p.chat_template().empty()) s.chat_template = p.chat_template();
  if (!p.sequence_mode().empty()) s.sequence_mode = p.sequence_mode();
  if (!p.bad_lines().empty()) s.bad_lines = p.bad_lines();
  s.eval_fraction = p.eval_fraction();
  if (!p.device().empty()) s.device = p.device();
  if (!p.compute_dtype().empty()) s.compute_dtype = p.compute_dtype();
  if (p.has_gpu_budget_bytes()) s.gpu_budget_bytes = p.gpu_budget_bytes();
  s.window = p.window();
  if (!p.activation_placement().empty()) s.activation_placement = p.activation_placement();
  s.checkpoint_every = p.checkpoint_every();
  if (!p.export_dtype().empty()) s.export_dtype = p.export_dtype();
  s.allow_seq_len_beyond_model = p.allow_seq_len_beyond_model();
  if (!p.nvme_state().empty()) s.nvme_state = p.nvme_state();
  return s;
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
  TrainingJobSpec spec = SpecFromProto(req->spec());
  if (!req->spec().has_gpu_budget_bytes()) spec.gpu_budget_bytes = options_.gpu_budget_bytes;
  auto r = jobs_.Submit(req->spec().name(), spec);
  if (!r.ok()) return ToGrpc(r.status());
  FillJob(r.value(), resp->mutable_job());
  return grpc::Status::OK;
}

grpc::Status SlideService::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::GetJobResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  auto r = jobs_.Get(req->id());
  if (!r.ok()) return ToGrpc(r.status());
  FillJob(r.value(), resp->mutable_job());
  return grpc::Status::OK;
}

grpc::Status SlideService::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                    v1::ListJobsResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  std::optional<JobState> filter;
  for (JobState s : {JobState::kQueued, JobState::kPreparing, JobState::kRunning, JobState::kSucceeded,
                     JobState::kFailed, JobState::kCancelled})
    if (req->state() == ToProto(s)) filter = s;
  if (req->page_size() < 0) return {grpc::StatusCode::INVALID_ARGUMENT, "page_size must be >= 0"};
  const size_t page = req->page_size() == 0 ? 100 : static_cast<size_t>(req->page_size());
  size_t start = 0;
  if (!req->page_token().empty()) {
    try {
      start = std::stoul(req->page_token());
    } catch (const std::exception&) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "bad page_token '" + req->page_token() + "'"};
    }
  }
  auto all = jobs_.List(filter);
  for (size_t i = start; i < all.size() && i < start + page; ++i) FillJob(all[i], resp->add_jobs());
  if (start + page < all.size()) resp->set_next_page_token(std::to_string(start + page));
  return grpc::Status::OK;
}

grpc::Status SlideService::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                     v1::CancelJobResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
  auto r = jobs_.Cancel(req->id());
  if (!r.ok()) return ToGrpc(r.status());
  FillJob(r.value(), resp->mutable_job());
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
      out.set_seq(e.seq);
      switch (e.kind) {
        case JobEventRecord::Kind::kState:
          out.set_state(ToProto(e.state));
          break;
        case JobEventRecord::Kind::kLog:
          out.set_log(e.log);
          break;
        case JobEventRecord::Kind::kMetrics: {
          auto* m = out.mutable_metrics();
          const auto& s = e.metrics;
          m->set_step(s.step);
          m->set_total_steps(s.total_steps);
          m->set_loss(s.loss);
          m->set_lr(s.lr);
          m->set_grad_norm(s.grad_norm);
          m->set_tokens_per_second(s.tokens_per_second);
          m->set_model_tflops(s.model_tflops);
          m->set_step_seconds(s.step_seconds);
          m->set_compute_seconds(s.compute_seconds);
          m->set_h2d_seconds(s.h2d_seconds);
          m->set_d2h_seconds(s.d2h_seconds);
          m->set_cpu_update_seconds(s.cpu_update_seconds);
          m->set_update_wait_seconds(s.update_wait_seconds);
          m->set_overlap_ratio(s.overlap_ratio);
          m->set_bounded_by(s.bounded_by);
          m->set_device_bytes(s.device_bytes);
          m->set_host_bytes(s.host_bytes);
          m->set_pinned_bytes(s.pinned_bytes);
          m->set_nvme_wait_seconds(s.nvme_wait_seconds);
          m->set_nvme_read_bytes(s.nvme_read_bytes);
          m->set_nvme_written_bytes(s.nvme_written_bytes);
          m->set_nvme_backend(s.nvme_backend);
          m->set_replayed(e.replayed);
          break;
        }
      }
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
  resp->set_version(options_.version);
  resp->set_device(options_.device.description);
  resp->set_device_memory_bytes(options_.device.total_bytes);
  resp->set_queued_jobs(jobs_.queued());
  resp->set_running_job(jobs_.running());
  resp->set_draining(draining_);
  const DeviceAllocatorStats alloc = ReadDeviceAllocatorStats();
  resp->set_device_reserved_bytes(alloc.reserved_bytes);
  resp->set_host_resident_bytes(ResidentHostBytes());
  resp->set_gpu_budget_bytes(options_.gpu_budget_bytes);
  resp->set_state_dir(options_.state_dir);
  resp->set_jobs_total(jobs_.total());
  return grpc::Status::OK;
}

}  // namespace slide
