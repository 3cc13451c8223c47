// The gRPC service: converts slide.v1 messages to engine structs and back, maps Status to gRPC codes, and
// never touches the engine itself (JobManager owns it).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "server/job_manager.h"
#include "slide/v1/slide.grpc.pb.h"

namespace slide {

grpc::Status ToGrpc(const Status& s);

class SlideService final : public v1::Slide::Service {
 public:
  explicit SlideService(JobManager& jobs) : jobs_(jobs) {}
  void SetDraining() { draining_ = true; }

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::GetJobResponse*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::CancelJobResponse*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*, grpc::ServerWriter<v1::JobEvent>*) override;
  grpc::Status GetServerStatus(grpc::ServerContext*, const v1::GetServerStatusRequest*, v1::ServerStatus*) override;

 private:
  JobManager& jobs_;
  std::atomic<bool> draining_{false};
};

// The engine struct a JobSpec message describes, with the daemon's defaults for unset fields.
TrainingJobSpec SpecFromProto(const v1::JobSpec& p);

}  // namespace slide
