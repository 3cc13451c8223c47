// The data-parallel tests' shared setup (the gtest and the rank processes it starts, tests/parallel/dp_rank.cc):
// one tiny model, its starting weights and every step's global batch, drawn from fixed seeds so each process makes
// the same; and the gathered state's file, read back by the test and by a rank that resumes from it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/transformer.h"
#include "engine/parallel/data_parallel_reference.h"
#include "engine/runtime/reference_trainer.h"

namespace slide::dp_fixture {

// Qwen2 for its biases (72 and 36 elements: padding follows them, so shard boundaries move to parameter starts).
inline ModelConfig Config() {
  auto cfg = ParseHfConfig(R"({"model_type": "qwen2", "vocab_size": 300, "hidden_size": 72,
      "intermediate_size": 200, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})",
                           "dp-fixture");
  if (!cfg.ok()) throw std::runtime_error(cfg.status().ToString());
  return *cfg;
}

// fp32 compute: the ranks' sums differ from one rank's only in the order of fp32 additions.
inline TrainerOptions Options(OptimizerKind optimizer) {
  TrainerOptions o;
  o.optimizer = optimizer;
  o.compute_dtype = c10::kFloat;
  o.adamw.weight_decay = 0.1;
  o.max_grad_norm = 0.5;  // small enough that clipping acts
  o.schedule.peak_lr = 2e-3;
  o.schedule.warmup_steps = 1;
  o.schedule.total_steps = 8;
  return o;
}

inline TrainerState Start(const ModelConfig& cfg) {
  at::manual_seed(7);
  TrainerState s;
  s.master = ZeroParams(BuildModelLayout(cfg), at::TensorOptions().dtype(at::kFloat));
  for (size_t u = 0; u < s.master.units.size(); ++u) {
    for (const auto& p : s.master.layout.units[u].params) {
      const bool norm = p.local.find("norm") != std::string::npos;  // RMSNorm scales start near 1
      ParamView(p, s.master.units[u]).copy_(at::randn(p.shape) * 0.05 + (norm ? 1.0 : 0.0));
    }
  }
  return s;
}

// Step s's global batch: 2 micro-batches of 6 sequences of 16 tokens (4 ranks take 2, 2, 1, 1 rows), some targets
// masked.
inline std::vector<MicroBatch> Batch(int64_t step, int64_t vocab) {
  at::manual_seed(1000 + step);
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < 2; ++m) {
    at::Tensor labels = at::randint(vocab, {6, 16}, at::kLong);
    labels.narrow(1, 0, 3 + m).fill_(kIgnoreIndex);
    at::Tensor ids = labels.clamp_min(0);
    mbs.push_back({ids, ShiftLabels(labels)});
  }
  return mbs;
}

// The state as raw fp32: the step, whether moments follow, every unit's master, then exp_avg and exp_avg_sq.
inline bool WriteState(const std::string& path, const TrainerState& s) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const int64_t header[2] = {s.step, s.exp_avg.empty() ? 0 : 1};
  std::fwrite(header, sizeof(header), 1, f);
  for (const auto* units : {&s.master.units, &s.exp_avg, &s.exp_avg_sq}) {
    for (const auto& t : *units) {
      at::Tensor c = t.contiguous().cpu();
      std::fwrite(c.data_ptr<float>(), sizeof(float), c.numel(), f);
    }
  }
  return std::fclose(f) == 0;
}

inline bool ReadState(const std::string& path, const ModelConfig& cfg, TrainerState& s) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  int64_t header[2] = {0, 0};
  bool ok = std::fread(header, sizeof(header), 1, f) == 1;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat);
  s.step = header[0];
  s.master = ZeroParams(BuildModelLayout(cfg), fp32);
  if (header[1]) {
    s.exp_avg = ZeroParams(s.master.layout, fp32).units;
    s.exp_avg_sq = ZeroParams(s.master.layout, fp32).units;
  }
  for (auto* units : {&s.master.units, &s.exp_avg, &s.exp_avg_sq}) {
    for (auto& t : *units) ok = ok && std::fread(t.data_ptr<float>(), sizeof(float), t.numel(), f) == size_t(t.numel());
  }
  std::fclose(f);
  return ok;
}

}  // namespace slide::dp_fixture
