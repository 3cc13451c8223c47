// AdamW written with ATen ops, step for step the arithmetic of torch.optim.AdamW (foreach=False):
// decoupled weight decay, bias-corrected moments. The oracle the fused CPU AdamW is tested against.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slide {

struct AdamWHyper {
  double lr = 1e-5;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// In place on fp32 param/exp_avg/exp_avg_sq; `step` is the 1-based count including this update.
void AdamWReferenceStep(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                        const AdamWHyper& hp, int64_t step);

}  // namespace slide
