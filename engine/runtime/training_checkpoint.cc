#include "engine/runtime/training_checkpoint.h"

#include <dirent.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "engine/common/files.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/model/safetensors.h"
#include "engine/runtime/sliding_trainer.h"

namespace slide {
namespace {

constexpr int kFormat = 1;

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

const char* kKinds[] = {"master", "exp_avg", "exp_avg_sq"};  // SlidingTrainer::ReadState's kinds

}  // namespace

Status SaveTrainingCheckpoint(const std::string& dir, const CheckpointInfo& info, SlidingTrainer& trainer) {
  SLIDE_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string name = StepDirName(info.step), step_dir = dir + "/" + name;
  SLIDE_RETURN_IF_ERROR(RemoveTree(step_dir));  // a torn attempt at the same step
  SLIDE_RETURN_IF_ERROR(MakeDirs(step_dir));
  SLIDE_RETURN_IF_ERROR(trainer.SyncUpdates());
  // Streamed unit by unit: with the NVMe tier the state is read back from disk as the file is written, so the
  // host never holds more than one unit's array.
  std::vector<StreamedTensor> tensors;
  // The model's units, or in adapter mode each layer's adapter (SlidingTrainer::state_units).
  const size_t units = trainer.state_units();
  for (int kind = 0; kind < 3; ++kind)
    for (size_t u = 0; u < units; ++u) {
      SLIDE_ASSIGN_OR_RETURN(const StateShape shape, trainer.StateShapeOf(kind, u));
      tensors.push_back(
          {std::string(kKinds[kind]) + "." + std::to_string(u), shape.dtype, {shape.numel}, [&trainer, kind, u] {
             return trainer.ReadState(kind, u);
           }});
    }
  SLIDE_RETURN_IF_ERROR(
      WriteSafetensorsStreamed(step_dir + "/optimizer.safetensors", std::move(tensors), {{"format", "slideformer"}}));
  nlohmann::json j = {{"format", kFormat},
                      {"step", info.step},
                      {"total_steps", info.total_steps},
                      {"order", {{"epoch", info.order_epoch}, {"index", info.order_index}}},
                      {"loss", info.loss},
                      {"fingerprint", info.fingerprint},
                      {"optimizer", OptimizerName(trainer.optimizer())}};
  SLIDE_RETURN_IF_ERROR(WriteFileAtomic(step_dir + "/state.json",
                                        j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
  SLIDE_RETURN_IF_ERROR(WriteFileAtomic(dir + "/LATEST", name + "\n"));
  // Older step directories are no longer referenced.
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> old;
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("step-", 0) == 0 && n != name) old.push_back(n);
    }
    ::closedir(d);
    for (const auto& n : old) SLIDE_RETURN_IF_ERROR(RemoveTree(dir + "/" + n));
  }
  return Status::Ok();
}

StatusOr<std::optional<CheckpointInfo>> ReadCheckpointInfo(const std::string& dir) {
  const std::string latest_path = dir + "/LATEST";
  if (!PathExists(latest_path)) return std::optional<CheckpointInfo>();
  SLIDE_ASSIGN_OR_RETURN(std::string latest, ReadFileToString(latest_path));
  while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  if (latest.rfind("step-", 0) != 0 || latest.find('/') != std::string::npos)
    return DataLoss("checkpoint '" + latest_path + "' does not name a step directory");
  const std::string state_path = dir + "/" + latest + "/state.json";

  SLIDE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(state_path));
  CheckpointInfo info;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.at("format").get<int>() != kFormat)
      return DataLoss("checkpoint '" + state_path + "' has format " + j.at("format").dump() + ", expected 1");
    info.step = j.at("step").get<int64_t>();
    info.total_steps = j.at("total_steps").get<int64_t>();
    info.order_epoch = j.at("order").at("epoch").get<int64_t>();
    info.order_index = j.at("order").at("index").get<int64_t>();
    info.loss = j.at("loss").is_null() ? std::nan("") : j.at("loss").get<double>();  // NaN is written as null
    info.fingerprint = j.at("fingerprint").get<std::string>();
    if (j.contains("optimizer")) info.optimizer = j.at("optimizer").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return DataLoss("checkpoint '" + state_path + "' is corrupt: " + e.what());
  }
  if (info.step < 0 || info.order_epoch < 0 || info.order_index < 0)
    return DataLoss("checkpoint '" + state_path + "' has negative counters");
  info.step_dir = dir + "/" + latest;
  return std::optional<CheckpointInfo>(std::move(info));
}

StatusOr<std::optional<CheckpointInfo>> LoadTrainingCheckpoint(const std::string& dir, const ResumeExpectation& job,
                                                               SlidingTrainer& trainer) {
  SLIDE_ASSIGN_OR_RETURN(std::optional<CheckpointInfo> read, ReadCheckpointInfo(dir));
  if (!read) return read;
  CheckpointInfo& info = *read;
  const std::string step_dir = info.step_dir, state_path = step_dir + "/state.json";
  if (info.optimizer != OptimizerName(trainer.optimizer()))
    return FailedPrecondition("checkpoint '" + state_path + "' holds the state of optimizer " + info.optimizer +
                              ", but this job's optimizer is " + OptimizerName(trainer.optimizer()) +
                              ": resume it with optimizer " + info.optimizer + ", or train from the start elsewhere");
  if (info.fingerprint != job.fingerprint)
    return FailedPrecondition("checkpoint '" + state_path + "' belongs to a different job (" + info.fingerprint +
                              ", this job is " + job.fingerprint + ")");
  // state.json is a file on disk like any other: what it claims must be possible for this job.
  if (info.total_steps != job.total_steps || info.step > job.total_steps)
    return DataLoss("checkpoint '" + state_path + "' claims step " + std::to_string(info.step) + " of " +
                    std::to_string(info.total_steps) + ", but this job has " + std::to_string(job.total_steps) +
                    " steps");
  if (info.order_index > job.train_sequences)
    return DataLoss("checkpoint '" + state_path + "' claims data position " + std::to_string(info.order_index) +
                    ", but this job has " + std::to_string(job.train_sequences) + " training sequences");
  if (info.step > 0 && !std::isfinite(info.loss))
    return DataLoss("checkpoint '" + state_path + "' records a non-finite loss at step " + std::to_string(info.step));

  const std::string tensors_path = step_dir + "/optimizer.safetensors";
  auto opened = SafetensorsFile::Open(tensors_path);
  if (!opened.ok()) return DataLoss("checkpoint is corrupt: " + opened.status().message());
  std::shared_ptr<SafetensorsFile> file = std::move(opened).value();
  SLIDE_RETURN_IF_ERROR(trainer.SyncUpdates());
  const size_t units = trainer.state_units();
  if (file->entries().size() != 3 * units)
    return DataLoss("checkpoint '" + tensors_path + "' has " + std::to_string(file->entries().size()) +
                    " tensors, expected " + std::to_string(3 * units));
  // Every tensor's name, dtype and size are checked before any is read; the values are checked as each is read.
  // A bad value fails the job, whose trainer is then discarded, so a half-restored state is never trained.
  std::vector<std::tuple<int, size_t, const SafetensorsEntry*, int64_t>> entries;  // + the byte arrays' fp32 prefix
  for (int kind = 0; kind < 3; ++kind) {
    for (size_t u = 0; u < units; ++u) {
      const std::string name = std::string(kKinds[kind]) + "." + std::to_string(u);
      const SafetensorsEntry* e = file->Find(name);
      if (e == nullptr) return DataLoss("checkpoint '" + tensors_path + "' lacks tensor '" + name + "'");
      SLIDE_ASSIGN_OR_RETURN(const StateShape shape, trainer.StateShapeOf(kind, u));
      if (e->dtype != shape.dtype || e->shape.size() != 1 || e->shape[0] != shape.numel)
        return DataLoss("checkpoint '" + tensors_path + "' tensor '" + name + "' is not " + c10::toString(shape.dtype) +
                        "[" + std::to_string(shape.numel) + "]");
      entries.emplace_back(kind, u, e, shape.float_prefix);
    }
  }
  for (const auto& [kind, unit, e, float_prefix] : entries) {
    auto value = file->Read(*e);
    if (!value.ok()) return DataLoss("checkpoint is corrupt: " + value.status().message());
    const at::Tensor floats = value->scalar_type() == at::kFloat
                                  ? *value
                                  : value->narrow(0, 0, 4 * float_prefix).view(at::kFloat);  // codes are any byte
    if (!AllFinite(floats))
      return DataLoss("checkpoint '" + tensors_path + "' tensor '" + e->name + "' holds NaN or infinite values");
    SLIDE_RETURN_IF_ERROR(trainer.WriteState(kind, unit, *value));
  }
  trainer.StateRestored(info.step);
  return std::optional<CheckpointInfo>(info);
}

}  // namespace slide
