// ResolveTrainer: the one place where a trainer's options and a job's budgets become the planner's request and the
// trainer's final options. Everything the request needs that follows from the options is derived there.
#include "engine/runtime/trainer_resolver.h"

#include <gtest/gtest.h>

#include "engine/optim/moment_layout.h"
#include "engine/runtime/unit_store.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

PlanRequest Budget() {
  PlanRequest b;
  b.micro_batch = 2;
  b.seq_len = 16;
  b.device_reserved_bytes = 0;
  b.device_budget_bytes = 64 << 20;
  return b;
}

SlidingOptions Options(c10::ScalarType dtype, double clip) {
  SlidingOptions o;
  o.train.compute_dtype = dtype;
  o.train.max_grad_norm = clip;
  o.train.device = c10::Device(c10::kCPU);
  return o;
}

TEST(TrainerResolver, DerivesTheRequestFromTheOptions) {
  const ModelConfig cfg = testing::ModelFixture::Load("llama3").config;
  SlidingOptions o = Options(c10::kBFloat16, 1.0);
  o.weights_first = WeightsFirst::kOn;
  o.device_update_share = 0.5;
  o.device_update_chunk = 1000;
  PlanRequest b = Budget();
  b.resident_layers = -1;
  const ResolvedTrainer r = testing::ValueOrDie(ResolveTrainer(cfg, o, b));
  EXPECT_EQ(r.request.model.num_layers, cfg.num_layers);
  EXPECT_EQ(r.request.compute_dtype, c10::kBFloat16);
  EXPECT_EQ(r.request.lm_head_chunk_tokens, o.train.loss.chunk_tokens);
  EXPECT_TRUE(r.request.weights_first);
  EXPECT_EQ(r.request.streamed_ring_bytes, o.DeviceUpdateRingBytes());
  EXPECT_EQ(r.plan.streamed_ring_bytes, o.DeviceUpdateRingBytes());
  EXPECT_EQ(r.options.window, r.plan.window);
  EXPECT_EQ(r.options.resident_layers, r.plan.resident_layers);
  EXPECT_EQ(r.options.device_budget_bytes, b.device_budget_bytes);
  EXPECT_EQ(r.planned_tokens, 32);
  EXPECT_FALSE(r.options.checkpoints_on_host);  // on the CPU parking would only copy

  // Weights first counts its ring only with clipping, and automatically only on CUDA.
  EXPECT_FALSE(testing::ValueOrDie(ResolveTrainer(cfg, Options(c10::kBFloat16, 0.0), b)).request.weights_first);
  SlidingOptions automatic = Options(c10::kBFloat16, 1.0);
  EXPECT_FALSE(testing::ValueOrDie(ResolveTrainer(cfg, automatic, b)).request.weights_first);

  // The NVMe tier: its arrays and ring from its options, no resident layers, the planner's layer count adopted.
  SlidingOptions tiered = Options(c10::kFloat, 1.0);
  tiered.nvme.mode = TierMode::kMomentsAndMaster;
  tiered.nvme.layers = 0;
  tiered.nvme.io.dirs = {"/unused"};
  PlanRequest host = b;
  host.host_budget_bytes = 64ll << 30;
  const ResolvedTrainer t = testing::ValueOrDie(ResolveTrainer(cfg, tiered, host));
  EXPECT_TRUE(t.request.moments_on_nvme);
  EXPECT_TRUE(t.request.master_on_nvme);
  EXPECT_EQ(t.request.nvme_ring_bytes, StateTierRingBytes(tiered.nvme));
  EXPECT_EQ(t.request.resident_layers, 0);
  EXPECT_EQ(t.options.nvme.layers, t.plan.nvme_layers);
  EXPECT_GE(t.options.nvme.layers, 1);
}

// adamw_8bit: no resident layers and no streamed share whatever was asked (the CPU updates every unit); on the NVMe
// tier a unit's moments travel whole, so the ring is 3 buffers of the largest tiered unit's moment bytes: a layer's
// when only layers are tiered, the head's (its norm beside the embedding-sized matrix) when every unit is.
// 8-bit moments: resident units planned as fp32 ones (an upper bound on their bytes), the streamed share as asked
// (jobs: DefaultDeviceUpdateShare, 0.5 for 8-bit moments), and a tier ring of whole units.
TEST(TrainerResolver, EightBitPlansResidentAndStreamedUnitsAndCountsAWholeUnitTierRing) {
  const ModelConfig cfg = testing::ValueOrDie(ParseHfConfig(
      R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
          "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8})",
      "8b"));
  const ModelLayout layout = BuildModelLayout(cfg);
  SlidingOptions o = Options(c10::kBFloat16, 1.0);
  o.train.optimizer = OptimizerKind::kAdamW8bit;
  o.device_update_share = 0.5;
  PlanRequest b = Budget();
  b.micro_batch = 8;
  b.seq_len = 1024;
  b.device_budget_bytes = 24ll << 30;
  b.resident_layers = -1;
  const ResolvedTrainer q8 = testing::ValueOrDie(ResolveTrainer(cfg, o, b));
  EXPECT_EQ(q8.request.optimizer, OptimizerKind::kAdamW8bit);
  EXPECT_EQ(q8.options.device_update_share, PlannedDeviceUpdateShare(0.5, q8.plan.checkpoints_on_host));
  o.train.optimizer = OptimizerKind::kAdamW;  // the same resident layers as fp32 moments' plan
  EXPECT_EQ(q8.options.resident_layers, testing::ValueOrDie(ResolveTrainer(cfg, o, b)).options.resident_layers);
  o.train.optimizer = OptimizerKind::kAdamW8bit;
  b.resident_layers = 2;  // asked for by count (sliding_bench --resident 2): kept
  EXPECT_EQ(testing::ValueOrDie(ResolveTrainer(cfg, o, b)).options.resident_layers, 2);
  b.resident_layers = -1;
  SlidingOptions job = o;
  job.train.device = c10::Device(c10::kCUDA, 0);
  EXPECT_EQ(DefaultDeviceUpdateShare(job), kDefaultDeviceUpdateShare8bit);
  job.train.optimizer = OptimizerKind::kAdamW;
  EXPECT_EQ(DefaultDeviceUpdateShare(job), kDefaultDeviceUpdateShare);
  job.train.compute_dtype = c10::kFloat;
  EXPECT_EQ(DefaultDeviceUpdateShare(job), 0);
  job.train.compute_dtype = c10::kBFloat16;
  job.nvme.mode = TierMode::kMoments;
  EXPECT_EQ(DefaultDeviceUpdateShare(job), 0);

  auto padded = [](int64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  o.nvme.mode = TierMode::kMoments;
  o.nvme.io.dirs = {"/unused"};
  for (const int64_t layers : {int64_t{1}, int64_t{-1}}) {
    o.nvme.layers = layers;
    const StateTierOptions tier = TierOptionsFor(layout, o);
    auto bytes = [](const UnitLayout& unit) { return MomentLayout(OptimizerKind::kAdamW8bit, unit).bytes(); };
    const int64_t largest =
        layers == 1 ? bytes(layout.layer(0)) : std::max(bytes(layout.embed()), bytes(layout.head()));
    EXPECT_EQ(tier.chunk_bytes, padded(largest)) << layers;
    EXPECT_EQ(tier.buffers, 3);
    const ResolvedTrainer t = testing::ValueOrDie(ResolveTrainer(cfg, o, b));
    EXPECT_EQ(t.request.nvme_ring_bytes, 3 * 2 * int64_t(tier.chunk_bytes)) << layers;
  }
  o.train.optimizer = OptimizerKind::kAdamW;  // fp32 moments: the tier's options as given
  EXPECT_EQ(TierOptionsFor(layout, o).chunk_bytes, o.nvme.chunk_bytes);
}

TEST(TrainerResolver, ParkedInputsStreamNothingAndRefusalsCarryTheNumbers) {
  const ModelConfig cfg = testing::ModelFixture::Load("llama3").config;
  SlidingOptions o = Options(c10::kBFloat16, 1.0);
  o.device_update_share = 0.5;
  o.device_update_chunk = 1000;
  PlanRequest b = Budget();
  b.checkpoints = CheckpointPlacement::kHost;
  const ResolvedTrainer r = testing::ValueOrDie(ResolveTrainer(cfg, o, b));
  EXPECT_TRUE(r.plan.checkpoints_on_host);
  EXPECT_EQ(r.plan.streamed_ring_bytes, 0);
  EXPECT_EQ(r.options.device_update_share, 0);

  b.device_budget_bytes = 64 << 10;
  auto refused = ResolveTrainer(cfg, o, b);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("GiB"), std::string::npos) << refused.status().message();
}

}  // namespace
}  // namespace slide
