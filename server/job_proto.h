// The one place where the daemon's records meet the slide.v1 schema: job specs, jobs, step metrics and events
// to their messages and back. The API serves these messages and the job store keeps them as proto JSON, so a
// field added to slide.proto and mapped here is served, stored and read back with no other change.
#pragma once

#include "engine/common/status.h"
#include "server/job_types.h"
#include "slide/v1/slide.pb.h"

namespace slide {

v1::JobState StateToProto(JobState s);
StatusOr<JobState> StateFromProto(v1::JobState s);

// The spec as it runs: every field, defaults filled in, so what is served and stored is what the engine got.
void SpecToProto(const std::string& name, const TrainingJobSpec& s, v1::JobSpec* p);
// The engine struct a JobSpec message describes, with the daemon's defaults for unset fields. The daemon-owned
// fields (allowed roots, NVMe directories, checkpoint directory) are not in the message. A choice the schema
// does not know (an open enum's bare number) is INVALID_ARGUMENT naming the field.
StatusOr<TrainingJobSpec> SpecFromProto(const v1::JobSpec& p);

void JobToProto(const JobRecord& r, v1::Job* out);
StatusOr<JobRecord> JobFromProto(const v1::Job& j);

void MetricsToProto(const TrainingStepEvent& s, bool replayed, v1::StepMetrics* m);
TrainingStepEvent MetricsFromProto(const v1::StepMetrics& m);

void EventToProto(const JobEventRecord& e, v1::JobEvent* out);
StatusOr<JobEventRecord> EventFromProto(const v1::JobEvent& e);

}  // namespace slide
