// The chunked LM head + cross-entropy equals the plain full-logits formulation, for any chunk size, in both
// forms: token chunks (the trainers' head) and vocabulary chunks (the lower-memory form), here through the ATen
// row operations; the kernels themselves are checked in fused_kernels_test.cc.
#include "engine/model/lm_head_loss.h"

#include "engine/kernels/fused_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "engine/model/transformer.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

struct Result {
  at::Tensor loss, grad_h, grad_w;
};

enum class Form { kTokenChunks, kVocabChunks };

Result RunLoss(const at::Tensor& h0, const at::Tensor& w0, const at::Tensor& targets, double norm, int64_t chunk,
               Form form = Form::kTokenChunks) {
  at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor loss;
  if (chunk == 0) {  // reference: full logits, sum-reduced CE with ignore index
    loss = at::cross_entropy_loss(at::matmul(h, w.t()).to(at::kFloat), targets, {}, at::Reduction::Sum, -100) / norm;
  } else if (form == Form::kTokenChunks) {
    loss = ChunkedLmHeadCrossEntropy(h, w, targets, norm, chunk);
  } else {
    loss = LmHeadCrossEntropyByVocabChunks(h, w, targets, norm, chunk);
  }
  (loss * 3.0).backward();  // a non-unit upstream gradient exercises backward's scaling
  return {loss.detach(), h.grad(), w.grad()};
}

TEST(ChunkedLmHeadCe, MatchesFullLogitsForEveryChunkSize) {
  at::manual_seed(0);
  const int64_t n = 37, hidden = 16, vocab = 50;
  at::Tensor h = at::randn({n, hidden}), w = at::randn({vocab, hidden}) * 0.3;
  at::Tensor t = at::randint(0, vocab, {n}, at::kLong);
  t.index_put_({at::tensor({0, 5, 6, 36})}, -100);
  Result ref = RunLoss(h, w, t, 33.0, 0);
  for (int64_t chunk : {1, 7, 36, 37, 1000}) {
    Result got = RunLoss(h, w, t, 33.0, chunk);
    EXPECT_LE(testing::Compare(got.loss, ref.loss).rel, 1e-6) << "chunk " << chunk;
    EXPECT_LE(testing::Compare(got.grad_h, ref.grad_h).rel, 1e-5) << "chunk " << chunk;
    EXPECT_LE(testing::Compare(got.grad_w, ref.grad_w).rel, 1e-5) << "chunk " << chunk;
  }
}

// chunk_tokens 1 over 37 tokens and a vocabulary of 50 gives one-column chunks; 7 gives 9 columns (the last
// chunk shorter), 37 and more the whole vocabulary at once. Targets land on every chunk edge.
TEST(ChunkedLmHeadCe, VocabularyChunksMatchFullLogits) {
  at::manual_seed(2);
  const int64_t n = 37, hidden = 16, vocab = 50;
  at::Tensor h = at::randn({n, hidden}), w = at::randn({vocab, hidden}) * 0.3;
  at::Tensor t = at::arange(n, at::kLong) * 9 % vocab;
  t.index_put_({at::tensor({1, 4, 30})}, -100);
  Result ref = RunLoss(h, w, t, 29.0, 0);
  for (int64_t chunk : {1, 7, 20, 37, 1000}) {
    Result got = RunLoss(h, w, t, 29.0, chunk, Form::kVocabChunks);
    EXPECT_LE(testing::Compare(got.loss, ref.loss).rel, 1e-6) << "chunk " << chunk;
    EXPECT_LE(testing::Compare(got.grad_h, ref.grad_h).rel, 1e-5) << "chunk " << chunk;
    EXPECT_LE(testing::Compare(got.grad_w, ref.grad_w).rel, 1e-5) << "chunk " << chunk;
    EXPECT_EQ(got.grad_h[1].abs().sum().item<float>(), 0.0f) << "an ignored token got a gradient";
  }
}

TEST(ChunkedLmHeadCe, VocabularyChunksInBf16StayCloseToFp32) {
  at::manual_seed(3);
  at::Tensor h = at::randn({64, 32}), w = at::randn({100, 32}) * 0.2;
  at::Tensor t = at::randint(0, 100, {64}, at::kLong);
  Result f = RunLoss(h, w, t, 64.0, 0);
  Result b = RunLoss(h.to(at::kBFloat16), w.to(at::kBFloat16), t, 64.0, 16, Form::kVocabChunks);
  EXPECT_EQ(b.grad_w.scalar_type(), at::kBFloat16);
  EXPECT_EQ(b.grad_h.scalar_type(), at::kBFloat16);
  EXPECT_LE(testing::Compare(b.loss, f.loss).rel, 1e-2);
  EXPECT_LE(testing::Compare(b.grad_h, f.grad_h).norm_rel, 2e-2);
  EXPECT_LE(testing::Compare(b.grad_w, f.grad_w).norm_rel, 2e-2);
}

TEST(ChunkedLmHeadCe, IgnoredTokensGetNoGradient) {
  at::Tensor h = at::randn({4, 8}), w = at::randn({10, 8});
  at::Tensor t = at::tensor({3, -100, 2, -100}, at::kLong);
  Result r = RunLoss(h, w, t, 2.0, 3);
  EXPECT_EQ(r.grad_h[1].abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(r.grad_h[3].abs().sum().item<float>(), 0.0f);
  EXPECT_GT(r.grad_h[0].abs().sum().item<float>(), 0.0f);
}

TEST(ChunkedLmHeadCe, Bf16StaysCloseToFp32) {
  at::manual_seed(1);
  at::Tensor h = at::randn({64, 32}), w = at::randn({100, 32}) * 0.2;
  at::Tensor t = at::randint(0, 100, {64}, at::kLong);
  Result f = RunLoss(h, w, t, 64.0, 16);
  Result b = RunLoss(h.to(at::kBFloat16), w.to(at::kBFloat16), t, 64.0, 16);
  EXPECT_EQ(b.grad_w.scalar_type(), at::kBFloat16);
  EXPECT_LE(testing::Compare(b.loss, f.loss).rel, 1e-2);
  EXPECT_LE(testing::Compare(b.grad_h, f.grad_h).norm_rel, 2e-2);
  EXPECT_LE(testing::Compare(b.grad_w, f.grad_w).norm_rel, 2e-2);
}

// Both forms agree on what a target may be because the trainers check the host batch first: -100 or a token id.
TEST(ChunkedLmHeadCe, TargetsOutsideTheVocabularyAreRefusedBeforeTheLoss) {
  EXPECT_EQ(CheckedTargetCount(at::tensor({0, 49, -100, 7}, at::kLong), 50), 3);
  for (int64_t bad : {50, -1, 1000}) {
    try {
      CheckedTargetCount(at::tensor(std::vector<int64_t>{3, -100, bad}, at::kLong), 50);
      ADD_FAILURE() << "target " << bad << " was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace())
                    .find("target " + std::to_string(bad) + " at position 2 is neither -100 nor a token id in [0, 50)"),
                std::string::npos)
          << e.what_without_backtrace();
    }
  }
}

// The row statistics fold chunk by chunk into logsumexp; a chunk whose logits are all -inf (here the first one
// of row 0, so its running state is still empty) adds nothing instead of turning the row into NaN.
TEST(ChunkedLmHeadCe, ChunkStatsFoldToLogSumExpWithAllMinusInfChunks) {
  at::Tensor logits = at::randn({3, 10}) * 4;
  logits[0].narrow(0, 0, 5).fill_(-INFINITY);
  logits[2].narrow(0, 5, 5).fill_(-INFINITY);
  const at::Tensor targets = at::tensor(std::vector<int64_t>{7, -100, 2}, at::kLong);
  at::Tensor run_max = at::full({3}, -INFINITY), run_sum = at::zeros({3}), picked = at::zeros({3});
  for (int64_t v0 : {0, 5})
    CrossEntropyChunkStats(logits.narrow(1, v0, 5).contiguous(), v0, targets, 10, run_max, run_sum, picked);
  const at::Tensor lse = run_max + run_sum.log();
  EXPECT_TRUE(at::allclose(lse, at::logsumexp(logits, {1}), 1e-6, 1e-6)) << lse << at::logsumexp(logits, {1});
  EXPECT_FLOAT_EQ(picked[0].item<float>(), logits[0][7].item<float>());
  EXPECT_FLOAT_EQ(picked[2].item<float>(), logits[2][2].item<float>());
}

}  // namespace
}  // namespace slide
