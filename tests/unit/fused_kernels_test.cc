// The fused CUDA kernels against the CPU reference (the unfused ops in fp32 on the exact same input values):
// forward outputs and autograd gradients, at sizes that take the 16-byte-pack path and at odd sizes that take
// the scalar path, in bf16 and fp32. The *_CUDA tests skip where there is no GPU.
#include "engine/kernels/fused_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "engine/model/lm_head_loss.h"
#include "engine/model/transformer.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

// Kernels off for the scope (the unfused path on the same device), restored on exit.
class KernelsOff {
 public:
  KernelsOff() : was_(FusedKernelsEnabled()) { SetFusedKernelsEnabled(false); }
  ~KernelsOff() { SetFusedKernelsEnabled(was_); }

 private:
  bool was_;
};

at::Tensor Cuda(const at::Tensor& t, at::ScalarType dtype) { return t.to(at::Device(at::kCUDA, 0), dtype); }
at::Tensor Cpu32(const at::Tensor& t) { return t.detach().to(at::kCPU, at::kFloat); }

// bf16 keeps 8 significant bits: one rounding of the output is 2^-9 relative, a few are tolerated.
double Tolerance(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 1.6e-2 : 2e-5; }

#define SKIP_WITHOUT_CUDA() \
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine"

TEST(FusedKernels, SwitchAndCpuDispatch) {
  const bool compiled = FusedKernelsEnabled();
  SetFusedKernelsEnabled(false);
  EXPECT_FALSE(FusedKernelsEnabled());
  SetFusedKernelsEnabled(true);
  EXPECT_EQ(FusedKernelsEnabled(), compiled);
  // Off CUDA the dispatchers are the unfused ops, bit for bit.
  at::manual_seed(0);
  at::Tensor x = at::randn({3, 5, 2, 8}), w = at::randn({8}), c = at::randn({5, 8}), s = at::randn({5, 8});
  EXPECT_FALSE(UseFusedKernels(x));
  EXPECT_TRUE(at::equal(RmsNorm(x, w, 1e-5), RmsNormUnfused(x, w, 1e-5)));
  EXPECT_TRUE(at::equal(ApplyRotary(x, c, s), ApplyRotaryUnfused(x, c, s)));
  EXPECT_TRUE(at::equal(SwiGlu(x, w.expand({3, 5, 2, 8})), SwiGluUnfused(x, w.expand({3, 5, 2, 8}))));
}

// The unfused rotary on [B, S, heads, D] is the usual [B, heads, S, D] formulation transposed.
TEST(FusedKernels, RotaryLayoutMatchesHeadMajorFormulation) {
  at::manual_seed(1);
  at::Tensor x = at::randn({2, 7, 3, 8}), c = at::randn({7, 8}), s = at::randn({7, 8});
  at::Tensor xt = x.transpose(1, 2);  // [B, heads, S, D]
  at::Tensor rot = at::cat({xt.narrow(-1, 4, 4).neg(), xt.narrow(-1, 0, 4)}, -1);
  EXPECT_TRUE(at::allclose(ApplyRotaryUnfused(x, c, s).transpose(1, 2), xt * c + rot * s));
}

struct Grads {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};

// out = fn(inputs) with every input a leaf; backward with a fixed random upstream gradient.
template <class Fn>
Grads RunWithGrad(std::vector<at::Tensor> inputs, const Fn& fn, const at::Tensor& upstream) {
  for (auto& t : inputs) t = t.detach().clone().requires_grad_(true);
  at::Tensor out = fn(inputs);
  out.backward(upstream.to(out.device(), out.scalar_type()));
  Grads g;
  g.out = out.detach();
  for (auto& t : inputs) g.grads.push_back(t.grad());
  return g;
}

void ExpectClose(const at::Tensor& got, const at::Tensor& ref, double tol, const std::string& what) {
  const auto d = testing::Compare(Cpu32(got), Cpu32(ref));
  EXPECT_LE(d.rel, tol) << what << ": max |diff| " << d.max_abs << " against scale " << d.ref_scale;
}

TEST(FusedKernels, RmsNormMatchesCpuReference_CUDA) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t rows, cols;
    at::ScalarType dtype;
  };
  // 4096 and 128 columns in bf16 take the pack path (the hidden norm and Qwen3's per-head norm); 1001 the scalar
  // path; fp32 both; 12288 columns need more than 48 KiB of shared memory in the backward.
  // Rows beyond the number of stripes (a few hundred) make each block of the backward walk several rows: the
  // register variant with its next-row prefetch (4096 bf16; 6144 bf16 and 3000 fp32 with a partly empty 4th pack
  // slot) and the shared-memory variant (1001 columns, scalar) accumulate the weight gradient across rows.
  for (const Case& c : {Case{67, 4096, at::kBFloat16}, Case{300, 128, at::kBFloat16}, Case{5, 1001, at::kBFloat16},
                        Case{33, 1000, at::kFloat}, Case{9, 1001, at::kFloat}, Case{3, 12288, at::kFloat},
                        Case{4096, 4096, at::kBFloat16}, Case{2000, 6144, at::kBFloat16},
                        Case{1500, 1001, at::kBFloat16}, Case{2000, 3000, at::kFloat}}) {
    at::manual_seed(c.rows);
    const at::Tensor x = at::randn({c.rows, c.cols}).to(c.dtype), w = (1 + 0.1 * at::randn({c.cols})).to(c.dtype);
    const at::Tensor up = at::randn({c.rows, c.cols});
    auto fn = [](std::vector<at::Tensor>& in) { return RmsNorm(in[0], in[1], 1e-5); };
    auto ref_fn = [](std::vector<at::Tensor>& in) { return RmsNormUnfused(in[0], in[1], 1e-5); };
    Grads got = RunWithGrad({Cuda(x, c.dtype), Cuda(w, c.dtype)}, fn, up);
    Grads ref = RunWithGrad({Cpu32(x), Cpu32(w)}, ref_fn, up);
    const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " + c10::toString(c.dtype);
    const double tol = Tolerance(c.dtype);
    ExpectClose(got.out, ref.out, tol, what + " y");
    ExpectClose(got.grads[0], ref.grads[0], tol, what + " dx");
    ExpectClose(got.grads[1], ref.grads[1], tol, what + " dw");
  }
}

TEST(FusedKernels, RotaryMatchesCpuReference_CUDA) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t b, s, heads, d;
    at::ScalarType dtype;
  };
  for (const Case& c : {Case{2, 33, 5, 128, at::kBFloat16}, Case{1, 7, 3, 6, at::kBFloat16},
                        Case{2, 17, 4, 64, at::kFloat}, Case{3, 5, 2, 10, at::kFloat}}) {
    at::manual_seed(c.d);
    const at::Tensor x = at::randn({c.b, c.s, c.heads, c.d}).to(c.dtype);
    const at::Tensor ang = at::randn({c.s, c.d});
    const at::Tensor cos = ang.cos().to(c.dtype), sin = ang.sin().to(c.dtype);
    const at::Tensor up = at::randn({c.b, c.s, c.heads, c.d});
    Grads got = RunWithGrad(
        {Cuda(x, c.dtype)},
        [&](std::vector<at::Tensor>& in) { return ApplyRotary(in[0], Cuda(cos, c.dtype), Cuda(sin, c.dtype)); }, up);
    Grads ref = RunWithGrad(
        {Cpu32(x)}, [&](std::vector<at::Tensor>& in) { return ApplyRotaryUnfused(in[0], Cpu32(cos), Cpu32(sin)); }, up);
    const std::string what = "D=" + std::to_string(c.d) + " " + c10::toString(c.dtype);
    ExpectClose(got.out, ref.out, Tolerance(c.dtype), what + " y");
    ExpectClose(got.grads[0], ref.grads[0], Tolerance(c.dtype), what + " dx");
  }
}

TEST(FusedKernels, SwiGluMatchesCpuReference_CUDA) {
  SKIP_WITHOUT_CUDA();
  for (const auto& [n, dtype] : std::vector<std::pair<int64_t, at::ScalarType>>{
           {3 * 4096, at::kBFloat16}, {1001, at::kBFloat16}, {4096, at::kFloat}, {999, at::kFloat}}) {
    at::manual_seed(n);
    const at::Tensor gate = (2 * at::randn({n})).to(dtype), upv = at::randn({n}).to(dtype), up = at::randn({n});
    auto fn = [](std::vector<at::Tensor>& in) { return SwiGlu(in[0], in[1]); };
    auto ref_fn = [](std::vector<at::Tensor>& in) { return SwiGluUnfused(in[0], in[1]); };
    Grads got = RunWithGrad({Cuda(gate, dtype), Cuda(upv, dtype)}, fn, up);
    Grads ref = RunWithGrad({Cpu32(gate), Cpu32(upv)}, ref_fn, up);
    const std::string what = std::to_string(n) + " " + c10::toString(dtype);
    ExpectClose(got.out, ref.out, Tolerance(dtype), what + " out");
    ExpectClose(got.grads[0], ref.grads[0], Tolerance(dtype), what + " dgate");
    ExpectClose(got.grads[1], ref.grads[1], Tolerance(dtype), what + " dup");
  }
}

// Round to nearest even both ways: the kernel equals Tensor::to bit for bit, odd lengths and specials included.
TEST(FusedKernels, ConversionEqualsTensorTo_CUDA) {
  SKIP_WITHOUT_CUDA();
  for (int64_t n : {1, 3, 4, 1000003}) {
    at::Tensor x = at::randn({n}) * 1e3;
    if (n > 8) x.narrow(0, 0, 4).copy_(at::tensor({INFINITY, -INFINITY, 1e-40f, -0.0f}));
    const at::Tensor xg = Cuda(x, at::kFloat);
    const at::Tensor b = ConvertDtype(xg, at::kBFloat16);
    EXPECT_TRUE(at::equal(b.cpu(), x.to(at::kBFloat16))) << n;
    EXPECT_TRUE(at::equal(ConvertDtype(b, at::kFloat).cpu(), x.to(at::kBFloat16).to(at::kFloat))) << n;
  }
}

// Both forms of the head with the kernels against the full-logits CPU reference in fp32: a vocabulary that is not
// a multiple of the pack (scalar path) and one that is, chunks with uneven tails (the token-chunked form takes 4x
// chunk tokens in bf16, 3x in fp32: 300 tokens in 256-row chunks, 77 in 30-row ones), ignored targets.
TEST(FusedKernels, LmHeadCrossEntropyMatchesCpuReference_CUDA) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t n, hidden, vocab, chunk;
    at::ScalarType dtype;
  };
  for (const Case& c : {Case{300, 64, 5003, 64, at::kBFloat16}, Case{256, 128, 8192, 100, at::kBFloat16},
                        Case{77, 32, 1001, 10, at::kFloat}, Case{64, 64, 4096, 1000, at::kFloat}}) {
    at::manual_seed(c.vocab);
    const at::Tensor h = at::randn({c.n, c.hidden}).to(c.dtype), w = (0.2 * at::randn({c.vocab, c.hidden})).to(c.dtype);
    at::Tensor t = at::randint(0, c.vocab, {c.n}, at::kLong);
    t.narrow(0, 0, 3).fill_(-100);
    t[5] = c.vocab - 1;
    t[6] = 0;
    const double norm = static_cast<double>(c.n - 3);
    Grads ref = RunWithGrad(
        {Cpu32(h), Cpu32(w)},
        [&](std::vector<at::Tensor>& in) {
          return at::cross_entropy_loss(at::matmul(in[0], in[1].t()), t, {}, at::Reduction::Sum, -100) / norm;
        },
        at::full({}, 2.0));
    for (const bool vocab_chunks : {false, true}) {
      Grads got = RunWithGrad(
          {Cuda(h, c.dtype), Cuda(w, c.dtype)},
          [&](std::vector<at::Tensor>& in) {
            return vocab_chunks ? LmHeadCrossEntropyByVocabChunks(in[0], in[1], t.cuda(), norm, c.chunk)
                                : ChunkedLmHeadCrossEntropy(in[0], in[1], t.cuda(), norm, c.chunk);
          },
          at::full({}, 2.0));
      const std::string what = std::string(vocab_chunks ? "vocabulary" : "token") +
                               " chunks, V=" + std::to_string(c.vocab) + " " + c10::toString(c.dtype);
      const double tol = c.dtype == at::kBFloat16 ? 2e-2 : 1e-5;
      ExpectClose(got.out, ref.out, tol, what + " loss");
      ExpectClose(got.grads[0], ref.grads[0], tol, what + " grad h");
      ExpectClose(got.grads[1], ref.grads[1], tol, what + " grad w");
      EXPECT_EQ(got.grads[0][0].abs().sum().item<float>(), 0.0f) << what << ": an ignored token got a gradient";
    }
  }
}

// A whole decoder layer (GQA, RoPE, SwiGLU, q/k norm) with and without the kernels on the GPU: the fused path is
// wired in the right layout.
TEST(FusedKernels, DecoderLayerWithKernelsMatchesWithout_CUDA) {
  SKIP_WITHOUT_CUDA();
  for (const std::string family : {"llama3", "qwen3"}) {
    const testing::ModelFixture fx = testing::ModelFixture::Load(family);
    const ModelConfig& cfg = fx.config;
    const ModelLayout layout = BuildModelLayout(cfg);
    at::manual_seed(4);
    const at::Tensor flat = (0.05 * at::randn({layout.layer(0).numel})).to(at::kCUDA, at::kBFloat16);
    const at::Tensor x = at::randn({2, 24, cfg.hidden_size}).to(at::kCUDA, at::kBFloat16);
    const at::Tensor up = at::randn({2, 24, cfg.hidden_size});
    const RopeTables rope = BuildRopeTables(cfg, 24, x.options());
    auto fn = [&](std::vector<at::Tensor>& in) {
      return DecoderLayerForward(cfg, layout.layer(0), in[0], in[1], rope);
    };
    Grads fused = RunWithGrad({flat, x}, fn, up);
    Grads plain;
    {
      KernelsOff off;
      plain = RunWithGrad({flat, x}, fn, up);
    }
    ExpectClose(fused.out, plain.out, 2e-2, family + " y");
    EXPECT_LE(testing::Compare(Cpu32(fused.grads[0]), Cpu32(plain.grads[0])).norm_rel, 2e-2) << family << " d weights";
    EXPECT_LE(testing::Compare(Cpu32(fused.grads[1]), Cpu32(plain.grads[1])).norm_rel, 2e-2) << family << " dx";
  }
}

// The engine's weights are views into one flat buffer; one at an odd offset is not 16-byte aligned and must take
// the kernels' scalar path, with the same result.
TEST(FusedKernels, UnalignedWeightViewsTakeTheScalarPath_CUDA) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(5);
  const at::Tensor flat = (1 + 0.1 * at::randn({4097})).to(at::kCUDA, at::kBFloat16);
  const at::Tensor w_odd = flat.narrow(0, 1, 4096), w_aligned = w_odd.clone();
  const at::Tensor x = at::randn({64, 4096}).to(at::kCUDA, at::kBFloat16);
  EXPECT_TRUE(at::equal(RmsNorm(x, w_odd, 1e-5), RmsNorm(x, w_aligned, 1e-5)));
}

// Logits far from zero with the row maximum in a later vocabulary chunk stress the online rescaling (and the
// base-2 conversion of the running maximum); a NaN logit makes that token's loss, and so the sum, NaN.
TEST(FusedKernels, LmHeadCrossEntropyLargeLogitsAndNaN_CUDA) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(6);
  const int64_t n = 64, hidden = 32, vocab = 4096;
  const at::Tensor h = at::randn({n, hidden});
  at::Tensor w = at::randn({vocab, hidden});
  w.narrow(0, vocab - 100, 100).mul_(40);  // the largest logits (|x| ~ 100+) sit in the last chunks
  const at::Tensor t = at::randint(0, vocab, {n}, at::kLong);
  const at::Tensor ref =
      at::cross_entropy_loss(at::matmul(h, w.t()), t, {}, at::Reduction::Sum, -100) / static_cast<double>(n);
  at::Tensor h_nan = h.clone();
  h_nan[3][0] = NAN;
  for (const auto form : {&ChunkedLmHeadCrossEntropy, &LmHeadCrossEntropyByVocabChunks}) {
    const at::Tensor got = form(h.cuda(), w.cuda(), t.cuda(), static_cast<double>(n), 4);
    EXPECT_LE(testing::Compare(got.cpu(), ref).rel, 1e-5);
    EXPECT_TRUE(std::isnan(form(h_nan.cuda(), w.cuda(), t.cuda(), 1.0, 4).item<float>()));
  }
}

// The weight gradient of bf16 operands is summed over the token chunks in fp32 (one rounding): the cuBLAS path
// with fp32 output was taken, not the fallback that rounds each chunk's product (32 tokens: two chunks of 4 x 4).
// The choice is remembered per process: ctest runs this test alone, so the answer is this head's.
TEST(FusedKernels, LmHeadGradientAccumulatesInFp32_CUDA) {
  SKIP_WITHOUT_CUDA();
  const at::Tensor h = at::randn({32, 64}).to(at::kCUDA, at::kBFloat16).requires_grad_(true);
  const at::Tensor w = at::randn({1000, 64}).to(at::kCUDA, at::kBFloat16).requires_grad_(true);
  ChunkedLmHeadCrossEntropy(h, w, at::randint(0, 1000, {32}, at::kLong).cuda(), 32.0, 4).backward();
  EXPECT_STREQ(LmHeadGradientAccumulation(/*cuda=*/true), "fp32");
}

}  // namespace
}  // namespace slide
