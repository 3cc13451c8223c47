// AdamW on tensors, with fp32 and with 8-bit moments: the CUDA kernels against the CPU bodies bit for bit (odd sizes,
// bf16 and fp32 gradients, with and without the bf16 weight, a NaN gradient, several steps), and the argument checks.
#include "engine/optim/tensor_adamw.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "engine/optim/adamw_8bit.h"

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
        if (with_out) {
          EXPECT_TRUE(at::equal(bits(out), bits(dout)));
        }
        EXPECT_TRUE(at::isnan(dp.cpu()[n / 2]).item<bool>());
      }
}

// The 8-bit state of n elements: codes zero, absmax zero (what a fresh job starts from).
struct State8bit {
  at::Tensor p, m, m_absmax, v, v_absmax;
  explicit State8bit(int64_t n, c10::Device device = c10::kCPU) {
    const int64_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
    auto bytes = at::TensorOptions().dtype(at::kByte).device(device);
    auto floats = at::TensorOptions().dtype(at::kFloat).device(device);
    p = at::randn({n}).to(device);
    m = at::zeros({n}, bytes);
    v = at::zeros({n}, bytes);
    m_absmax = at::zeros({blocks}, floats);
    v_absmax = at::zeros({blocks}, floats);
  }
  void Step(const at::Tensor& g, const at::Tensor& out, int64_t step) {
    TensorAdamW8bit(p, m, m_absmax, v, v_absmax, g, out, Args(step), SimdLevel::kScalar);
  }
};

TEST(TensorAdamW8bit, CpuTensorsRunTheCpuBody) {
  const int64_t n = 4096 + 77;  // a short last block
  at::manual_seed(5);
  State8bit a(n);
  State8bit b(n);
  b.p.copy_(a.p);
  at::Tensor out = at::empty({n}, at::kBFloat16), out2 = at::empty({n}, at::kBFloat16);
  for (int64_t step = 1; step <= 2; ++step) {
    const at::Tensor g = at::randn({n}).to(at::kBFloat16);
    a.Step(g, out, step);
    AdamW8bitSpan span;
    span.param = b.p.data_ptr<float>();
    span.exp_avg = b.m.data_ptr<uint8_t>();
    span.exp_avg_absmax = b.m_absmax.data_ptr<float>();
    span.exp_avg_sq = b.v.data_ptr<uint8_t>();
    span.exp_avg_sq_absmax = b.v_absmax.data_ptr<float>();
    span.grad_bf16 = reinterpret_cast<const c10::BFloat16*>(g.data_ptr());
    span.out_bf16 = reinterpret_cast<c10::BFloat16*>(out2.data_ptr());
    span.n = n;
    CpuAdamW8bit(span, Args(step), SimdLevel::kScalar);
  }
  EXPECT_TRUE(at::equal(a.p, b.p));
  EXPECT_TRUE(at::equal(a.m, b.m));
  EXPECT_TRUE(at::equal(a.v, b.v));
  EXPECT_TRUE(at::equal(a.m_absmax, b.m_absmax));
  EXPECT_TRUE(at::equal(a.v_absmax, b.v_absmax));
  EXPECT_TRUE(at::equal(out, out2));
  EXPECT_GT(a.m_absmax.max().item<float>(), 0.0f);  // the state moved
}

TEST(TensorAdamW8bit, RefusesMismatchedTensors) {
  const int64_t n = 600;  // 3 blocks
  State8bit s(n);
  const at::Tensor g = at::zeros({n});
  const AdamWStepArgs a = Args(1);
  auto run = [&](const at::Tensor& m, const at::Tensor& m_absmax) {
    TensorAdamW8bit(s.p, m, m_absmax, s.v, s.v_absmax, g, at::Tensor(), a, SimdLevel::kScalar);
  };
  EXPECT_NO_THROW(run(s.m, s.m_absmax));
  EXPECT_THROW(run(s.m, at::zeros({2})), c10::Error);                // absmax for 2 blocks, not 3
  EXPECT_THROW(run(s.m.to(at::kChar), s.m_absmax), c10::Error);      // signed codes
  EXPECT_THROW(run(at::zeros({n}), s.m_absmax), c10::Error);         // fp32 moments
  EXPECT_THROW(run(s.m, s.m_absmax.to(at::kBFloat16)), c10::Error);  // bf16 absmax
  EXPECT_THROW(TensorAdamW8bit(s.p, s.m, s.m_absmax, s.v, s.v_absmax, g, at::zeros({n}), a, SimdLevel::kScalar),
               c10::Error);  // fp32 out
}

// The 8-bit kernel: the CPU body's operation order, its absmax (a max) and its nearest-code rule, bit for bit.
TEST(TensorAdamW8bit, CudaKernelEqualsTheCpuBodyBitForBit_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine";
  const c10::Device cuda(c10::kCUDA, 0);
  for (int64_t n : {1, 255, 4096 + 77, (1 << 20) + 7})
    for (bool bf16_grad : {true, false})
      for (bool with_out : {true, false}) {
        SCOPED_TRACE("n " + std::to_string(n) + (bf16_grad ? " bf16" : " fp32") + (with_out ? " out" : ""));
        at::manual_seed(n);
        State8bit h(n);
        State8bit d(n, cuda);
        d.p.copy_(h.p);
        at::Tensor out = at::empty({n}, at::kBFloat16), dout = at::empty({n}, at::kBFloat16).to(cuda);
        for (int64_t step = 1; step <= 4; ++step) {
          at::Tensor g = at::randn({n}) * 0.01;
          if (step == 2) g.narrow(0, 0, (n + 1) / 2).zero_();  // whole blocks of zero moments: absmax 0
          if (step == 4) g[n / 2] = std::numeric_limits<float>::quiet_NaN();
          if (bf16_grad) g = g.to(at::kBFloat16);
          h.Step(g, with_out ? out : at::Tensor(), step);
          d.Step(g.to(cuda), with_out ? dout : at::Tensor(), step);
        }
        // As for fp32 AdamW: NaNs set to one pattern on both sides first.
        auto bits = [](const at::Tensor& t) {
          at::Tensor c = t.cpu().clone();
          if (c.scalar_type() == at::kFloat) c.masked_fill_(at::isnan(c), std::numeric_limits<float>::quiet_NaN());
          return c.scalar_type() == at::kByte ? c : c.view(c.scalar_type() == at::kFloat ? at::kInt : at::kShort);
        };
        EXPECT_TRUE(at::equal(bits(h.p), bits(d.p)));
        EXPECT_TRUE(at::equal(bits(h.m), bits(d.m)));
        EXPECT_TRUE(at::equal(bits(h.v), bits(d.v)));
        EXPECT_TRUE(at::equal(bits(h.m_absmax), bits(d.m_absmax)));
        EXPECT_TRUE(at::equal(bits(h.v_absmax), bits(d.v_absmax)));
        if (with_out) {
          EXPECT_TRUE(at::equal(bits(out), bits(dout)));
        }
        EXPECT_TRUE(at::isnan(d.p.cpu()[n / 2]).item<bool>());
      }
}

}  // namespace
}  // namespace slide
