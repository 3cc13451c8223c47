#include "engine/model/lm_head_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "engine/kernels/fused_ops.h"
#include "engine/model/transformer.h"

namespace slide {
namespace {

// Both forms compute the gradients in the forward. They wait in the context, not as saved variables, so that the
// backward can take them out (the graph keeps no reference) and scale them in place: no second copy of the
// [V, H] weight gradient at the peak.
void StashGradients(torch::autograd::AutogradContext* ctx, const at::Tensor& grad_h, const at::Tensor& grad_w) {
  ctx->saved_data["grad_h"] = grad_h;
  ctx->saved_data["grad_w"] = grad_w;
}

torch::autograd::variable_list TakeScaledGradients(torch::autograd::AutogradContext* ctx,
                                                   const torch::autograd::variable_list& grad_outputs) {
  TORCH_CHECK(ctx->saved_data.count("grad_h") == 1, "lm head loss: backward ran twice (retain_graph is unsupported)");
  at::Tensor grad_h = ctx->saved_data["grad_h"].toTensor(), grad_w = ctx->saved_data["grad_w"].toTensor();
  ctx->saved_data.erase("grad_h");
  ctx->saved_data.erase("grad_w");
  const at::Tensor& go = grad_outputs[0];
  grad_h.mul_(go);  // in place, computed in fp32 (the 0-dim upstream gradient does not round to bf16 first)
  if (grad_w.defined()) grad_w.mul_(go);  // undefined for a frozen head (LoRA)
  return {grad_h, grad_w, at::Tensor(), at::Tensor(), at::Tensor()};
}

std::atomic<int> g_out_dtype_works[2] = {-1, -1};  // per device kind (CPU, CUDA): -1 unknown, 1 yes, 0 no

// acc [M, N] fp32 += a [M, K] @ b [K, N] with one rounding: bf16 operands go through cuBLAS with fp32 output
// (addmm's out_dtype); where that overload is not available the product is rounded to bf16 first.
void AddMatmulFp32(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kFloat) {
    acc.addmm_(a, b);
    return;
  }
  std::atomic<int>& works = g_out_dtype_works[a.is_cuda() ? 1 : 0];
  if (works.load() != 0) {
    try {
      at::addmm_out(acc, acc, a, b, at::kFloat);
      works.store(1);
      return;
    } catch (const c10::Error&) {
      if (works.load() == 1) throw;
      works.store(0);
    }
  }
  acc.add_(at::mm(a, b));
}

// Every token's running maximum and sum(exp) of its logits and its target's logit (fp32 [n]), folded chunk by chunk
// by CrossEntropyChunkStats; both forms' log-sum-exp and loss come from them.
struct RowStats {
  RowStats(int64_t n, const at::TensorOptions& f32)
      : max(at::full({n}, -std::numeric_limits<float>::infinity(), f32)),
        sum(at::zeros({n}, f32)),
        picked(at::zeros({n}, f32)) {}
  // Folds logits [rows, cols] (vocabulary ids from vocab_offset) of the tokens [row0, row0 + rows).
  void Fold(const at::Tensor& logits, int64_t vocab_offset, const at::Tensor& targets, int64_t vocab, int64_t row0) {
    const int64_t rows = logits.size(0);
    at::Tensor m = max.narrow(0, row0, rows), s = sum.narrow(0, row0, rows), p = picked.narrow(0, row0, rows);
    CrossEntropyChunkStats(logits, vocab_offset, targets.narrow(0, row0, rows), vocab, m, s, p);
  }
  at::Tensor Lse(int64_t row0, int64_t rows) const {
    return max.narrow(0, row0, rows) + sum.narrow(0, row0, rows).log();
  }
  // sum over valid targets of (lse - the target's logit) / normalizer, from every token's lse.
  at::Tensor Loss(const at::Tensor& lse, const at::Tensor& targets, int64_t vocab, double normalizer) const {
    const at::Tensor valid = targets.ge(0) & targets.lt(vocab);
    return at::where(valid, lse - picked, at::zeros({}, lse.options())).sum().div_(normalizer);
  }
  at::Tensor max, sum, picked;
};

// Tokens a chunk holds within the bytes memory_plan.cc's head phase gives chunk_tokens tokens' logits (e + 4 + e a
// logit). Where the kernels run, the logits stay in the compute dtype alone (the kernels read them and rewrite them
// in place as their gradient): 4x chunk_tokens in bf16, 3x in fp32. The ATen row operations hold the logits and two
// fp32 temporaries at once (e + 8): 0.8x in bf16, 1x in fp32.
int64_t TokensPerChunk(const at::Tensor& h, int64_t chunk_tokens) {
  const int64_t e = h.element_size();
  return std::max<int64_t>(1, chunk_tokens * (e + 4 + e) / (UseFusedKernels(h) ? e : e + 8));
}

// The token-chunked form: the tokens in chunks, each against the whole vocabulary, so a chunk's log-sum-exp is
// known after its one logits GEMM and its gradient follows at once: three GEMMs in all (logits, input gradient,
// weight gradient), one fewer than the vocabulary-chunked form, for an fp32 [V, H] weight-gradient sum across the
// chunks (cuBLAS with fp32 output, rounded once at the end). Each token's input gradient is one GEMM over the
// whole vocabulary, rounded once. The row operations are the kernels on CUDA and ATen ops elsewhere.
struct TokenChunkedLmHeadCe : public torch::autograd::Function<TokenChunkedLmHeadCe> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& targets, double normalizer, int64_t chunk_tokens) {
    const bool need_grad = h.requires_grad() || weight.requires_grad();
    const int64_t n = h.size(0), vocab = weight.size(0);
    const at::Tensor t = targets.to(h.device(), at::kLong).contiguous();
    const at::Tensor hc = h.contiguous();
    const int64_t rows = TokensPerChunk(h, chunk_tokens);
    const auto f32 = h.options().dtype(at::kFloat);
    RowStats stats(n, f32);
    // A frozen head (LoRA) needs no weight gradient: neither its GEMM nor its fp32 [V, H] sum.
    const bool need_grad_w = weight.requires_grad();
    at::Tensor grad_h, grad_w32;
    if (need_grad) grad_h = at::empty_like(hc);
    if (need_grad_w) grad_w32 = at::zeros(weight.sizes(), f32);
    for (int64_t start = 0; start < n; start += rows) {
      const int64_t len = std::min(rows, n - start);
      const at::Tensor h_rows = hc.narrow(0, start, len);
      at::Tensor g = at::mm(h_rows, weight.t());  // [len, V] logits, then their gradient
      stats.Fold(g, 0, t, vocab, start);
      if (!need_grad) continue;
      CrossEntropyChunkGrad(g, 0, t.narrow(0, start, len), vocab, stats.Lse(start, len), 1.0 / normalizer);
      at::Tensor grad_h_rows = grad_h.narrow(0, start, len);
      at::mm_out(grad_h_rows, g, weight);
      if (need_grad_w) AddMatmulFp32(grad_w32, g.t(), h_rows);
    }
    at::Tensor loss = stats.Loss(stats.Lse(0, n), t, vocab, normalizer);
    if (need_grad)
      StashGradients(ctx, grad_h, need_grad_w ? ConvertDtype(grad_w32, weight.scalar_type()) : at::Tensor());
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    return TakeScaledGradients(ctx, grad_outputs);
  }
};

// The vocabulary-chunked form: all tokens at once, the vocabulary in chunks of `cols` rows of the weight. Pass 1 folds
// each chunk's logits into every token's running max / sum(exp) and picks the target logit; pass 2 (gradients)
// recomputes each chunk's logits, turns them into d(loss)/d(logits) in place, writes that chunk's rows of the weight
// gradient in one GEMM (fp32 accumulation over all tokens, rounded once) and adds its share of the input gradient into
// an fp32 [N, H] sum. One more GEMM than the token-chunked form, but no [V, H] fp32 accumulator and no per-chunk [V, H]
// product.
struct VocabChunkedLmHeadCe : public torch::autograd::Function<VocabChunkedLmHeadCe> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& targets, double normalizer, int64_t chunk_tokens) {
    const bool need_grad = h.requires_grad() || weight.requires_grad();
    const int64_t n = h.size(0), vocab = weight.size(0);
    const at::Tensor t = targets.to(h.device(), at::kLong).contiguous();
    const at::Tensor hc = h.contiguous();
    // As many logits at once as the token-chunked form holds: chunk_tokens * vocab.
    const int64_t budget = std::max<int64_t>(1, chunk_tokens * vocab / std::max<int64_t>(n, 1));
    const int64_t cols = std::min<int64_t>(vocab, budget >= 64 ? budget / 64 * 64 : budget);
    const auto f32 = h.options().dtype(at::kFloat);
    RowStats stats(n, f32);
    for (int64_t v0 = 0; v0 < vocab; v0 += cols) {
      const int64_t len = std::min(cols, vocab - v0);
      stats.Fold(at::mm(hc, weight.narrow(0, v0, len).t()), v0, t, vocab, 0);  // logits [n, len]
    }
    const at::Tensor lse = stats.Lse(0, n);
    at::Tensor loss = stats.Loss(lse, t, vocab, normalizer);
    if (need_grad) {
      const bool need_grad_w = weight.requires_grad();  // not for a frozen head (LoRA)
      at::Tensor grad_w = need_grad_w ? at::empty_like(weight) : at::Tensor();
      at::Tensor grad_h32 = at::zeros({n, h.size(1)}, f32);
      for (int64_t v0 = 0; v0 < vocab; v0 += cols) {
        const int64_t len = std::min(cols, vocab - v0);
        const at::Tensor w_chunk = weight.narrow(0, v0, len);
        at::Tensor g = at::mm(hc, w_chunk.t());  // [n, len] logits, then their gradient
        CrossEntropyChunkGrad(g, v0, t, vocab, lse, 1.0 / normalizer);
        if (need_grad_w) {
          at::Tensor grad_w_rows = grad_w.narrow(0, v0, len);
          at::mm_out(grad_w_rows, g.t(), hc);
        }
        AddMatmulFp32(grad_h32, g, w_chunk);
      }
      StashGradients(ctx, ConvertDtype(grad_h32, h.scalar_type()), grad_w);
    }
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    return TakeScaledGradients(ctx, grad_outputs);
  }
};

void CheckHeadArguments(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets, double normalizer,
                        int64_t chunk_tokens) {
  TORCH_CHECK(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1), "lm head: shape mismatch");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == h.size(0), "lm head: targets must be [N]");
  TORCH_CHECK(normalizer > 0, "lm head: normalizer must be positive");
  TORCH_CHECK(chunk_tokens > 0, "lm head: chunk_tokens must be positive");
}

}  // namespace

const char* LmHeadGradientAccumulation(bool cuda) {
  switch (g_out_dtype_works[cuda ? 1 : 0].load()) {
    case 1:
      return "fp32";
    case 0:
      return "bf16_product_per_chunk";
    default:
      return "unused";
  }
}

at::Tensor LmHeadCrossEntropyByVocabChunks(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                           double normalizer, int64_t chunk_tokens) {
  CheckHeadArguments(h, weight, targets, normalizer, chunk_tokens);
  return VocabChunkedLmHeadCe::apply(h, weight, targets, normalizer, chunk_tokens);
}

at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                     double normalizer, int64_t chunk_tokens) {
  CheckHeadArguments(h, weight, targets, normalizer, chunk_tokens);
  return TokenChunkedLmHeadCe::apply(h, weight, targets, normalizer, chunk_tokens);
}

}  // namespace slide
