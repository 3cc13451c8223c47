#include "engine/optim/adamw_reference.h"

#include <ATen/ATen.h>

#include <cmath>

namespace slide {

void AdamWReferenceStep(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                        const AdamWHyper& hp, int64_t step) {
  param.mul_(1.0 - hp.lr * hp.weight_decay);
  exp_avg.lerp_(grad, 1.0 - hp.beta1);
  exp_avg_sq.mul_(hp.beta2).addcmul_(grad, grad, 1.0 - hp.beta2);
  const double bias_correction1 = 1.0 - std::pow(hp.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(hp.beta2, static_cast<double>(step));
  const double step_size = hp.lr / bias_correction1;
  at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(hp.eps);
  param.addcdiv_(exp_avg, denom, -step_size);
}

}  // namespace slide
