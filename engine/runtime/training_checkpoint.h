// Training checkpoints: everything a job needs to resume exactly. A checkpoint is a directory
//   <dir>/step-NNNNNNNN/optimizer.safetensors   fp32 master, exp_avg, exp_avg_sq per unit (adamw_8bit's moments
//                                               as the bytes MomentLayout lays out: codes, absmax, small fp32)
//   <dir>/step-NNNNNNNN/state.json              step, data position, last loss, the job's fingerprint, optimizer
//   <dir>/LATEST                                name of the newest complete step directory
// LATEST is replaced atomically after the step directory is complete, so a crash mid-write leaves the previous
// checkpoint in charge. The LR schedule is a function of the step; the data order is (seed, position); the
// model has no dropout, so there is no other RNG state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/common/status.h"

namespace slide {

class SlidingTrainer;

struct CheckpointInfo {
  int64_t step = 0;  // optimizer steps done
  int64_t total_steps = 0;
  int64_t order_epoch = 0, order_index = 0;  // BatchOrder::Position of the next batch
  double loss = 0;                           // loss of the last step
  std::string fingerprint;                   // the job (model shape, data, batch) it belongs to
  std::string optimizer = "adamw";           // OptimizerName of the state (checkpoints before it was written: adamw)
  std::string step_dir;                      // where it was read from (set by ReadCheckpointInfo)
};

// The newest checkpoint's state.json (LATEST's step directory) without its tensors: nullopt without LATEST.
StatusOr<std::optional<CheckpointInfo>> ReadCheckpointInfo(const std::string& dir);

// Waits for the trainer's updates, writes a new step directory, points LATEST at it and removes older ones.
// The step must be newer than the one LATEST names (its directory is replaced first).
Status SaveTrainingCheckpoint(const std::string& dir, const CheckpointInfo& info, SlidingTrainer& trainer);

// What a checkpoint must agree with to be resumed by a job.
struct ResumeExpectation {
  std::string fingerprint;      // CheckpointInfo::fingerprint of this job
  int64_t total_steps = 0;      // the job's steps: a checkpoint's step lies in [0, total_steps]
  int64_t train_sequences = 0;  // the data position lies within the training split
};

// No LATEST in `dir`: nullopt. Otherwise loads the state into `trainer` (and calls StateRestored) after checking
// the optimizer (a checkpoint of the other one is refused: FAILED_PRECONDITION naming both), the fingerprint, the step
// and data position against `job`, every tensor's shape, and every value (finite); anything corrupt or mismatched is an
// error naming the file.
StatusOr<std::optional<CheckpointInfo>> LoadTrainingCheckpoint(const std::string& dir, const ResumeExpectation& job,
                                                               SlidingTrainer& trainer);

}  // namespace slide
