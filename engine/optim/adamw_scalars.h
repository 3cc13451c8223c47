// The per-step scalars of the fused AdamW update, shared by the CPU body (cpu_adamw.cc) and the CUDA kernel
// (engine/kernels/adamw.cu) so both run the same arithmetic: computed once in double, rounded to float like
// torch's scalar arguments. No dependencies: the kernels library includes it without LibTorch.
#pragma once

namespace slide {

struct AdamWScalars {
  float decay;         // 1 - lr * weight_decay (1 for parameters without decay)
  float one_minus_b1;  // lerp weight of the first moment
  float b2, one_minus_b2;
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
  float eps;
  float grad_scale;  // multiplies the gradient first (the clipping coefficient)
};

}  // namespace slide
