// What a job's spec must satisfy on its own (ValidateTrainingJobSpec, training_job.h) and the field helpers the job's
// other checks share: every refusal names the job field.
#pragma once

#include <cstdint>
#include <string>

#include "engine/common/status.h"
#include "engine/runtime/training_job.h"

namespace slide {

// Sequences per forward/backward (micro_batch_size 0 means no accumulation).
int64_t MicroBatchSize(const TrainingJobSpec& s);

// "job field 'F' <what>" unless ok.
Status Field(bool ok, const std::string& field, const std::string& what);

// "job field 'F' must be in [lo, hi]" (+ a note on what the values mean).
Status InRange(int64_t value, int64_t lo, int64_t hi, const std::string& field, const std::string& note = "");

}  // namespace slide
