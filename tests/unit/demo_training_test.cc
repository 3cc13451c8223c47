// End to end through the engine on the bundled demo (deploy/demo): HF checkpoint + tokenizer + JSONL dataset
// -> sliding-window trainer (host as device) -> loss falls -> HF export reloads with the same loss.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/data/dataset.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/runtime/sliding_trainer.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

std::string DemoPath(const std::string& rel) { return std::string(SLIDE_FIXTURES_DIR) + "/../../deploy/demo/" + rel; }

MicroBatch ToBatch(const std::vector<Sequence>& seqs, const std::vector<int64_t>& idx) {
  const int64_t S = static_cast<int64_t>(seqs[0].input_ids.size());
  at::Tensor ids = at::empty({static_cast<int64_t>(idx.size()), S}, at::kLong);
  at::Tensor labels = at::empty_like(ids);
  for (size_t r = 0; r < idx.size(); ++r)
    for (int64_t t = 0; t < S; ++t) {
      ids[r][t] = seqs[idx[r]].input_ids[t];
      labels[r][t] = seqs[idx[r]].labels[t];
    }
  return {ids, ShiftLabels(labels)};
}

double EvalLoss(const ModelConfig& cfg, const ModelParams& params, const MicroBatch& b) {
  c10::InferenceMode guard;
  return ModelLoss(cfg, params, b.input_ids, b.targets, CountValidTargets(b.targets)).item<double>();
}

TEST(DemoTraining, LossFallsAndTheExportReloads) {
  const std::string model_dir = DemoPath("model");
  ModelConfig cfg = testing::ValueOrDie(LoadHfConfig(model_dir));
  auto tok = testing::ValueOrDie(Tokenizer::FromFile(model_dir + "/tokenizer.json"));
  DatasetOptions d;
  d.seq_len = 32;
  d.mode = SequenceMode::kTruncate;
  d.special_tokens.bos_token = "<|begin_of_text|>";
  d.special_tokens.eos_token = "<|end_of_text|>";
  d.eval_fraction = 0.05;
  Dataset ds = testing::ValueOrDie(LoadJsonlDataset(DemoPath("train.jsonl"), *tok, d));
  EXPECT_EQ(ds.stats.samples, 600);
  EXPECT_EQ(ds.stats.truncated, 0);

  TrainerOptions o;
  o.adamw = {.lr = 0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.0};
  o.schedule = {.kind = LrScheduleKind::kCosine, .peak_lr = 3e-3, .warmup_steps = 5, .total_steps = 60};
  o.max_grad_norm = 1.0;
  o.compute_dtype = c10::kFloat;
  ModelParams init = testing::ValueOrDie(LoadHfCheckpoint(model_dir, cfg, c10::kFloat));
  SlidingTrainer trainer(cfg, init, {.train = o, .window = 2});

  std::vector<int64_t> eval_idx(ds.eval.size());
  for (size_t k = 0; k < eval_idx.size(); ++k) eval_idx[k] = static_cast<int64_t>(k);
  MicroBatch eval = ToBatch(ds.eval, eval_idx);
  const double eval_before = EvalLoss(cfg, init, eval);

  BatchOrder order(static_cast<int64_t>(ds.train.size()), 1);
  std::vector<double> losses;
  for (int step = 0; step < 60; ++step)
    losses.push_back(trainer.Step({ToBatch(ds.train, order.Next(16))}).value().loss);
  ModelParams trained = trainer.Master();
  const double eval_after = EvalLoss(cfg, trained, eval);
  // The sliding evaluation (forward only, weights streamed through the slots) gives the same number.
  EXPECT_NEAR(trainer.EvalLoss({eval}).value(), eval_after, 1e-5 * eval_after);
  std::printf("DEMO loss %.3f -> %.3f over 60 steps; held-out %.3f -> %.3f\n", losses.front(), losses.back(),
              eval_before, eval_after);
  EXPECT_LT(losses.back(), 0.5 * losses.front());
  EXPECT_LT(eval_after, 0.5 * eval_before);

  testing::TempDir out;
  ASSERT_OK(ExportHfCheckpoint(out.path(), model_dir, trained, {.dtype = c10::kFloat}));
  ModelParams reloaded = testing::ValueOrDie(LoadHfCheckpoint(out.path(), cfg, c10::kFloat));
  EXPECT_DOUBLE_EQ(EvalLoss(cfg, reloaded, eval), eval_after);
  auto tok2 = Tokenizer::FromFile(out.File("tokenizer.json"));
  EXPECT_TRUE(tok2.ok());
}

}  // namespace
}  // namespace slide
