// AdamW on tensors: the CUDA kernel against the CPU body bit for bit (odd sizes, bf16 and fp32 gradients, with
// and without the bf16 weight, a NaN gradient, several steps), and the argument checks.
#include "engine/optim/tensor_adamw.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

namespace slide {
namespace {

AdamWStepArgs Args(int64_t step) {
  AdamWStepArgs a;
  a.hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  a.step = step;
  a.grad_scale = 0.7f;
  return a;
}

TEST(TensorAdamW, CpuTensorsRunTheCpuBody) {
  const int64_t n = 1001;
  at::manual_seed(3);
  at::Tensor p = at::randn({n}), m = at::zeros({n}), v = at::zeros({n}), g = at::randn({n}).to(at::kBFloat16);
  at::Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  at::Tensor out = at::empty({n}, at::kBFloat16), out2 = at::empty({n}, at::kBFloat16);
  TensorAdamW(p, m, v, g, out, Args(1), SimdLevel::kScalar);
  AdamWSpan span{p2.data_ptr<float>(),
                 m2.data_ptr<float>(),
                 v2.data_ptr<float>(),
                 reinterpret_cast<const c10::BFloat16*>(g.data_ptr()),
                 nullptr,
                 reinterpret_cast<c10::BFloat16*>(out2.data_ptr()),
                 n};
  CpuAdamW(span, Args(1), SimdLevel::kScalar);
  EXPECT_TRUE(at::equal(p, p2));
  EXPECT_TRUE(at::equal(m, m2));
  EXPECT_TRUE(at::equal(v, v2));
  EXPECT_TRUE(at::equal(out, out2));
}

TEST(TensorAdamW, RefusesMismatchedTensors) {
  at::Tensor p = at::zeros({8}), m = at::zeros({8}), v = at::zeros({8}), g = at::zeros({8});
  const AdamWStepArgs a = Args(1);
  EXPECT_THROW(TensorAdamW(p, m, at::zeros({7}), g, at::Tensor(), a, SimdLevel::kScalar), c10::Error);
  EXPECT_THROW(TensorAdamW(p, m, v, at::zeros({8}, at::kDouble), at::Tensor(), a, SimdLevel::kScalar), c10::Error);
  EXPECT_THROW(TensorAdamW(p, m, v, g, at::zeros({8}), a, SimdLevel::kScalar), c10::Error);  // fp32 out
  EXPECT_THROW(TensorAdamW(p.to(at::kBFloat16), m, v, g, at::Tensor(), a, SimdLevel::kScalar), c10::Error);
  EXPECT_THROW(TensorAdamW(p, m, v, at::zeros({16}).slice(0, 0, 16, 2), at::Tensor(), a, SimdLevel::kScalar),
               c10::Error);  // a strided gradient
}

// The kernel uses the CPU body's operation order with every step rounded on its own: results are bit-equal.
TEST(TensorAdamW, CudaKernelEqualsTheCpuBodyBitForBit_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine";
  const c10::Device cuda(c10::kCUDA, 0);
  for (int64_t n : {1, 255, 100003, (1 << 20) + 7})
    for (bool bf16_grad : {true, false})
      for (bool with_out : {true, false}) {
        SCOPED_TRACE("n " + std::to_string(n) + (bf16_grad ? " bf16" : " fp32") + (with_out ? " out" : ""));
        at::manual_seed(n);
        at::Tensor p = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
        at::Tensor dp = p.to(cuda), dm = m.to(cuda), dv = v.to(cuda);
        at::Tensor out = at::empty({n}, at::kBFloat16), dout = at::empty({n}, at::kBFloat16).to(cuda);
        for (int64_t step = 1; step <= 3; ++step) {
          at::Tensor g = at::randn({n}) * 0.01;
          if (step == 2) g.narrow(0, 0, (n + 1) / 2).zero_();
          if (step == 3) g[n / 2] = std::numeric_limits<float>::quiet_NaN();  // propagates, written as 0x7FC0
          if (bf16_grad) g = g.to(at::kBFloat16);
          TensorAdamW(p, m, v, g, with_out ? out : at::Tensor(), Args(step), SimdLevel::kScalar);
          TensorAdamW(dp, dm, dv, g.to(cuda), with_out ? dout : at::Tensor(), Args(step), SimdLevel::kScalar);
        }
        // Bitwise, except that a NaN's sign and payload are the processor's (x86 makes 0xFFC00000, CUDA
        // 0x7FFFFFFF): NaNs are set to one pattern on both sides first (the bf16 weight's is already 0x7FC0).
        auto bits = [](const at::Tensor& t) {
          at::Tensor c = t.cpu().clone();
          if (c.scalar_type() == at::kFloat) c.masked_fill_(at::isnan(c), std::numeric_limits<float>::quiet_NaN());
          return c.view(c.scalar_type() == at::kFloat ? at::kInt : at::kShort);
        };
        EXPECT_TRUE(at::equal(bits(p), bits(dp)));
        EXPECT_TRUE(at::equal(bits(m), bits(dm)));
        EXPECT_TRUE(at::equal(bits(v), bits(dv)));
        if (with_out) EXPECT_TRUE(at::equal(bits(out), bits(dout)));
        EXPECT_TRUE(at::isnan(dp.cpu()[n / 2]).item<bool>());
      }
}

}  // namespace
}  // namespace slide
