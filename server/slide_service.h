// The gRPC service: converts slide.v1 messages to engine structs and back (job_proto.h), maps Status to gRPC
// codes, and never runs the engine itself (JobManager owns that); it only asks it to describe the machine.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/job_manager.h"
#include "slide/v1/slide.grpc.pb.h"

namespace slide {

grpc::Status ToGrpc(const Status& s);

struct ServiceOptions {
  std::string token;  // when set, every call must carry "authorization: Bearer <token>"
  int64_t gpu_budget_bytes =
      24ll << 30;         // the daemon's per-job default, reported by GetStatus (JobManagerOptions applies it)
  std::string state_dir;  // reported by GetServerStatus
  std::string version = "0.1.0";
};

class SlideService final : public v1::Slide::Service {
 public:
  // `engine` answers GetServerStatus's questions about the machine.
  SlideService(JobManager& jobs, Engine& engine, ServiceOptions options)
      : jobs_(jobs), engine_(engine), options_(std::move(options)) {}
  void SetDraining() { draining_ = true; }

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::GetJobResponse*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::CancelJobResponse*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*, grpc::ServerWriter<v1::JobEvent>*) override;
  grpc::Status GetServerStatus(grpc::ServerContext*, const v1::GetServerStatusRequest*, v1::ServerStatus*) override;

 private:
  grpc::Status Authorize(grpc::ServerContext* ctx) const;

  JobManager& jobs_;
  Engine& engine_;
  ServiceOptions options_;
  std::atomic<bool> draining_{false};
};

}  // namespace slide
