#include "engine/model/lm_head_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "engine/model/transformer.h"

namespace slide {
namespace {

struct ChunkedLmHeadCe : public torch::autograd::Function<ChunkedLmHeadCe> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& targets, double normalizer, int64_t chunk_tokens) {
    const bool need_grad = h.requires_grad() || weight.requires_grad();
    const int64_t n = h.size(0);
    at::Tensor loss = at::zeros({}, h.options().dtype(at::kFloat));
    at::Tensor grad_h, grad_w32;
    if (need_grad) {
      grad_h = at::empty_like(h);
      grad_w32 = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    }
    const double scale = 1.0 / normalizer;
    for (int64_t start = 0; start < n; start += chunk_tokens) {
      const int64_t len = std::min(chunk_tokens, n - start);
      at::Tensor hc = h.narrow(0, start, len);
      at::Tensor tc = targets.narrow(0, start, len);
      at::Tensor logits = at::matmul(hc, weight.t()).to(at::kFloat);  // [len, V]
      at::Tensor lse = at::logsumexp(logits, {1});                    // [len]
      at::Tensor valid = tc.ne(kIgnoreIndex);
      at::Tensor safe_t = tc.clamp_min(0).unsqueeze(1);
      at::Tensor picked = logits.gather(1, safe_t).squeeze(1);
      loss.add_(((lse - picked) * valid).sum());
      if (!need_grad) continue;
      // d(CE)/d(logits) = softmax - onehot(target), zero for ignored tokens, scaled by 1/normalizer.
      at::Tensor g = logits.sub_(lse.unsqueeze(1)).exp_();
      g.scatter_add_(1, safe_t, at::full({len, 1}, -1.0, g.options()));
      g.mul_((valid.to(at::kFloat) * scale).unsqueeze(1));
      at::Tensor gc = g.to(h.scalar_type());
      grad_h.narrow(0, start, len).copy_(at::matmul(gc, weight));
      if (h.scalar_type() == at::kFloat) {
        grad_w32.addmm_(gc.t(), hc);
      } else {
        grad_w32.add_(at::matmul(gc.t(), hc));  // low-precision product per chunk, fp32 sum across chunks
      }
    }
    if (need_grad) ctx->save_for_backward({grad_h, grad_w32.to(weight.scalar_type())});
    return loss.div_(normalizer);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& go = grad_outputs[0];
    return {saved[0] * go.to(saved[0].scalar_type()), saved[1] * go.to(saved[1].scalar_type()), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                     double normalizer, int64_t chunk_tokens) {
  TORCH_CHECK(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1), "lm head: shape mismatch");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == h.size(0), "lm head: targets must be [N]");
  TORCH_CHECK(normalizer > 0, "lm head: normalizer must be positive");
  TORCH_CHECK(chunk_tokens > 0, "lm head: chunk_tokens must be positive");
  return ChunkedLmHeadCe::apply(h, weight, targets, normalizer, chunk_tokens);
}

}  // namespace slide
