// Each fused CUDA kernel at the 8B shape (8K tokens): checked against the unfused LibTorch ops on the same GPU,
// then timed alone (forward and backward launchers) and against the unfused ops (forward, and forward+backward
// through autograd). Bandwidth counts the bytes a kernel must move at least (inputs read once, outputs
// written once) against the H200's measured copy rate. The LM head + cross-entropy is timed whole (GEMMs
// included) in its token- and vocabulary-chunked forms with the kernels, against the token-chunked LibTorch form
// and the full-logits form, with the peak device memory each needs. One JSON line per kernel.
//
// usage: kernel_bench [TOKENS] [COPY_GBPS] [KERNEL] [HIDDEN]   (defaults 8192, 4300, every kernel family and 4096;
// KERNEL is one of rmsnorm, rope, swiglu, convert, ce, lm_head, nf4; HIDDEN is the head's). nf4: QLoRA's base
// dequantisation over one Llama-3-70B layer's MLP weight (8192 x 28672), checked bit for bit against the CPU routine,
// with plain and double-quantised scales.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "engine/kernels/cuda_launchers.h"
#include "engine/kernels/fused_ops.h"
#include "engine/model/lm_head_loss.h"
#include "engine/quant/tensor_nf4.h"
#include "engine/runtime/device_info.h"

using namespace slide;

namespace {

double g_copy_gbps = 4300;

double TimeMs(const std::function<void()>& fn, int iters = 20) {
  fn();  // warm-up (and the allocator's first segments)
  c10::cuda::device_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  c10::cuda::device_synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

cudaStream_t Stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
void Check(cudaError_t e) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kernel_bench: %s\n", cudaGetErrorString(e));
    std::exit(1);
  }
}
double RelErr(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bf = b.to(at::kFloat);
  return (a.to(at::kFloat) - bf).abs().max().item<double>() / std::max(bf.abs().max().item<double>(), 1e-30);
}

// fwd/bwd: the fused launchers alone; unfused_*: the LibTorch composite (forward without autograd, and
// forward + backward through autograd).
struct Figures {
  std::string kernel, shape;
  double fwd_bytes = 0, bwd_bytes = 0;
  double fwd_ms = 0, bwd_ms = 0, unfused_fwd_ms = 0, unfused_fwd_bwd_ms = 0, fused_fwd_bwd_ms = 0;
  double max_rel_err = 0;
};

void Print(const Figures& f) {
  auto gbps = [](double bytes, double ms) { return ms > 0 ? bytes / ms / 1e6 : 0.0; };
  std::printf(
      "{\"bench\": \"kernel\", \"kernel\": \"%s\", \"shape\": \"%s\", \"dtype\": \"bf16\", \"max_rel_err_vs_unfused\": "
      "%.3g, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_gb_s\": %.0f, \"bwd_gb_s\": %.0f, \"fwd_pct_of_copy\": %.1f, "
      "\"bwd_pct_of_copy\": %.1f, \"unfused_fwd_ms\": %.4f, \"fused_fwd_bwd_autograd_ms\": %.4f, "
      "\"unfused_fwd_bwd_autograd_ms\": %.4f, \"speedup_fwd\": %.2f, \"speedup_fwd_bwd\": %.2f, \"copy_gb_s\": %.0f}\n",
      f.kernel.c_str(), f.shape.c_str(), f.max_rel_err, f.fwd_ms, f.bwd_ms, gbps(f.fwd_bytes, f.fwd_ms),
      gbps(f.bwd_bytes, f.bwd_ms), 100 * gbps(f.fwd_bytes, f.fwd_ms) / g_copy_gbps,
      100 * gbps(f.bwd_bytes, f.bwd_ms) / g_copy_gbps, f.unfused_fwd_ms, f.fused_fwd_bwd_ms, f.unfused_fwd_bwd_ms,
      f.unfused_fwd_ms / f.fwd_ms, f.unfused_fwd_bwd_ms / f.fused_fwd_bwd_ms, g_copy_gbps);
  std::fflush(stdout);
}

// Forward + backward through autograd of fn(inputs) with the given upstream gradient.
double TimeAutograd(std::vector<at::Tensor> inputs, const std::function<at::Tensor(std::vector<at::Tensor>&)>& fn,
                    const at::Tensor& upstream) {
  for (auto& t : inputs) t = t.detach().requires_grad_(true);
  return TimeMs([&] {
    at::Tensor out = fn(inputs);
    out.backward(upstream);
    for (auto& t : inputs) t.mutable_grad().reset();
  });
}

class KernelsSwitch {
 public:
  explicit KernelsSwitch(bool on) { SetFusedKernelsEnabled(on); }
  ~KernelsSwitch() { SetFusedKernelsEnabled(true); }
};

void BenchRmsNorm(int64_t tokens, int64_t hidden) {
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor x = at::randn({tokens, hidden}, opt), w = 1 + 0.1 * at::randn({hidden}, opt), dy = at::randn_like(x);
  at::Tensor y = at::empty_like(x), dx = at::empty_like(x), dw = at::empty_like(w);
  at::Tensor rstd = at::empty({tokens}, opt.dtype(at::kFloat));
  at::Tensor partial = at::empty({cuda::RmsNormPartialRows(tokens), hidden}, opt.dtype(at::kFloat));
  Figures f{"rmsnorm", std::to_string(tokens) + "x" + std::to_string(hidden)};
  const double act = double(tokens) * hidden * 2;
  f.fwd_bytes = 2 * act + tokens * 4.0;
  f.bwd_bytes = 3 * act + tokens * 4.0;
  f.fwd_ms = TimeMs([&] {
    Check(cuda::RmsNormForward(cuda::DType::kBFloat16, x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(),
                               tokens, hidden, 1e-5f, Stream()));
  });
  f.bwd_ms = TimeMs([&] {
    Check(cuda::RmsNormBackward(cuda::DType::kBFloat16, dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                                rstd.data_ptr<float>(), dx.data_ptr(), dw.data_ptr(), partial.data_ptr<float>(), tokens,
                                hidden, Stream()));
  });
  f.max_rel_err = RelErr(RmsNorm(x, w, 1e-5), RmsNormUnfused(x, w, 1e-5));
  f.unfused_fwd_ms = TimeMs([&] { RmsNormUnfused(x, w, 1e-5); });
  auto fused = [](std::vector<at::Tensor>& in) { return RmsNorm(in[0], in[1], 1e-5); };
  auto plain = [](std::vector<at::Tensor>& in) { return RmsNormUnfused(in[0], in[1], 1e-5); };
  f.fused_fwd_bwd_ms = TimeAutograd({x, w}, fused, dy);
  f.unfused_fwd_bwd_ms = TimeAutograd({x, w}, plain, dy);
  Print(f);
}

void BenchRope(int64_t tokens, int64_t heads, int64_t dim) {
  const int64_t seq = 1024, batch = tokens / seq;
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor x = at::randn({batch, seq, heads, dim}, opt), dy = at::randn_like(x), y = at::empty_like(x);
  at::Tensor ang = at::randn({seq, dim}, opt.dtype(at::kFloat));
  at::Tensor cos = ang.cos().to(at::kBFloat16), sin = ang.sin().to(at::kBFloat16);
  Figures f{"rope", std::to_string(batch) + "x" + std::to_string(seq) + "x" + std::to_string(heads) + "x" +
                        std::to_string(dim)};
  f.fwd_bytes = f.bwd_bytes = 2.0 * x.numel() * 2;
  for (bool bwd : {false, true}) {
    (bwd ? f.bwd_ms : f.fwd_ms) = TimeMs([&] {
      Check(cuda::Rope(cuda::DType::kBFloat16, (bwd ? dy : x).data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(),
                       tokens, seq, heads, dim, bwd, Stream()));
    });
  }
  f.max_rel_err = RelErr(ApplyRotary(x, cos, sin), ApplyRotaryUnfused(x, cos, sin));
  f.unfused_fwd_ms = TimeMs([&] { ApplyRotaryUnfused(x, cos, sin); });
  auto fused = [&](std::vector<at::Tensor>& in) { return ApplyRotary(in[0], cos, sin); };
  auto plain = [&](std::vector<at::Tensor>& in) { return ApplyRotaryUnfused(in[0], cos, sin); };
  f.fused_fwd_bwd_ms = TimeAutograd({x}, fused, dy);
  f.unfused_fwd_bwd_ms = TimeAutograd({x}, plain, dy);
  Print(f);
}

void BenchSwiGlu(int64_t tokens, int64_t inter) {
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor g = 2 * at::randn({tokens, inter}, opt), u = at::randn_like(g), d = at::randn_like(g);
  at::Tensor out = at::empty_like(g), dg = at::empty_like(g), du = at::empty_like(g);
  Figures f{"swiglu", std::to_string(tokens) + "x" + std::to_string(inter)};
  const double act = double(g.numel()) * 2;
  f.fwd_bytes = 3 * act;
  f.bwd_bytes = 5 * act;
  f.fwd_ms = TimeMs([&] {
    Check(cuda::SwiGluForward(cuda::DType::kBFloat16, g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), Stream()));
  });
  f.bwd_ms = TimeMs([&] {
    Check(cuda::SwiGluBackward(cuda::DType::kBFloat16, d.data_ptr(), g.data_ptr(), u.data_ptr(), dg.data_ptr(),
                               du.data_ptr(), g.numel(), Stream()));
  });
  f.max_rel_err = RelErr(SwiGlu(g, u), SwiGluUnfused(g, u));
  f.unfused_fwd_ms = TimeMs([&] { SwiGluUnfused(g, u); });
  auto fused = [](std::vector<at::Tensor>& in) { return SwiGlu(in[0], in[1]); };
  auto plain = [](std::vector<at::Tensor>& in) { return SwiGluUnfused(in[0], in[1]); };
  f.fused_fwd_bwd_ms = TimeAutograd({g, u}, fused, d);
  f.unfused_fwd_bwd_ms = TimeAutograd({g, u}, plain, d);
  Print(f);
}

// fwd = fp32 -> bf16, bwd = bf16 -> fp32, on a [V, H] weight-gradient-sized array.
void BenchConvert(int64_t vocab, int64_t hidden) {
  at::Tensor f32 = at::randn({vocab, hidden}, at::TensorOptions().device(at::kCUDA));
  at::Tensor b16 = at::empty_like(f32, f32.options().dtype(at::kBFloat16)), back = at::empty_like(f32);
  Figures f{"convert_fp32_bf16", std::to_string(vocab) + "x" + std::to_string(hidden)};
  f.fwd_bytes = f.bwd_bytes = f32.numel() * 6.0;
  f.fwd_ms =
      TimeMs([&] { Check(cuda::FloatToBFloat16(f32.data_ptr<float>(), b16.data_ptr(), f32.numel(), Stream())); });
  f.bwd_ms =
      TimeMs([&] { Check(cuda::BFloat16ToFloat(b16.data_ptr(), back.data_ptr<float>(), f32.numel(), Stream())); });
  f.max_rel_err = at::equal(ConvertDtype(f32, at::kBFloat16), f32.to(at::kBFloat16)) ? 0.0 : 1.0;
  f.unfused_fwd_ms = TimeMs([&] { f32.to(at::kBFloat16); });
  f.fused_fwd_bwd_ms = f.fwd_ms + f.bwd_ms;
  f.unfused_fwd_bwd_ms = f.unfused_fwd_ms + TimeMs([&] { b16.to(at::kFloat); });
  Print(f);
}

// The cross-entropy row kernels alone on one vocabulary chunk [tokens, cols]: stats (read) and grad (read+write).
void BenchCrossEntropyRows(int64_t tokens, int64_t cols, int64_t vocab) {
  const auto opt = at::TensorOptions().device(at::kCUDA);
  at::Tensor logits = at::randn({tokens, cols}, opt.dtype(at::kBFloat16)), work = logits.clone();
  at::Tensor t = at::randint(0, vocab, {tokens}, opt.dtype(at::kLong));
  at::Tensor m = at::full({tokens}, -INFINITY, opt), s = at::zeros({tokens}, opt), p = at::zeros({tokens}, opt);
  at::Tensor lse = at::full({tokens}, 12.0, opt);
  Figures f{"cross_entropy_rows", std::to_string(tokens) + "x" + std::to_string(cols)};
  f.fwd_bytes = double(logits.numel()) * 2;
  f.bwd_bytes = double(logits.numel()) * 4;
  f.fwd_ms = TimeMs([&] {
    Check(cuda::CrossEntropyStats(cuda::DType::kBFloat16, logits.data_ptr(), tokens, cols, 0, t.data_ptr<int64_t>(),
                                  vocab, m.data_ptr<float>(), s.data_ptr<float>(), p.data_ptr<float>(), Stream()));
  });
  f.bwd_ms = TimeMs([&] {
    Check(cuda::CrossEntropyGrad(cuda::DType::kBFloat16, work.data_ptr(), tokens, cols, 0, t.data_ptr<int64_t>(), vocab,
                                 lse.data_ptr<float>(), 1e-4f, Stream()));
  });
  // The unfused equivalent of the two passes on the same chunk (fp32 logits, logsumexp, softmax - onehot).
  auto unfused = [&] {
    at::Tensor lf = logits.to(at::kFloat);
    at::Tensor l = at::logsumexp(lf, {1});
    at::Tensor g = lf.sub_(l.unsqueeze(1)).exp_();
    g.scatter_add_(1, t.clamp(0, cols - 1).unsqueeze(1), at::full({tokens, 1}, -1.0, g.options()));
    g.mul_(1e-4).to(at::kBFloat16);
  };
  f.unfused_fwd_ms = TimeMs([&] { at::logsumexp(logits.to(at::kFloat), {1}); });
  f.unfused_fwd_bwd_ms = TimeMs(unfused);
  f.fused_fwd_bwd_ms = f.fwd_ms + f.bwd_ms;
  m.fill_(-INFINITY);
  s.zero_();
  Check(cuda::CrossEntropyStats(cuda::DType::kBFloat16, logits.data_ptr(), tokens, cols, 0, t.data_ptr<int64_t>(),
                                vocab, m.data_ptr<float>(), s.data_ptr<float>(), p.data_ptr<float>(), Stream()));
  f.max_rel_err = RelErr(m + s.log(), at::logsumexp(logits.to(at::kFloat), {1}));
  Print(f);
}

int64_t Allocated() { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current; }
int64_t PeakAllocated() { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak; }

// The whole head: final hidden [tokens, H] x weight [V, H] -> loss and both gradients, in four forms.
void BenchLmHead(int64_t tokens, int64_t hidden, int64_t vocab, int64_t chunk_tokens) {
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor h = at::randn({tokens, hidden}, opt), w = 0.02 * at::randn({vocab, hidden}, opt);
  at::Tensor t = at::randint(0, vocab, {tokens}, opt.dtype(at::kLong));
  const double norm = static_cast<double>(tokens);
  struct Form {
    const char* name;
    bool kernels;
    bool full_logits;
    bool vocab_chunks;
  };
  at::Tensor ref_loss, ref_gh, ref_gw;
  for (const Form& form :
       {Form{"full_logits_unfused", false, true, false}, Form{"token_chunked_unfused", false, false, false},
        Form{"vocab_chunked_fused", true, false, true}, Form{"token_chunked_fused", true, false, false}}) {
    KernelsSwitch sw(form.kernels);
    at::Tensor hl = h.detach().requires_grad_(true), wl = w.detach().requires_grad_(true);
    at::Tensor loss;
    auto run = [&] {
      hl.mutable_grad().reset();
      wl.mutable_grad().reset();
      loss = form.full_logits
                 ? at::cross_entropy_loss(at::mm(hl, wl.t()).to(at::kFloat), t, {}, at::Reduction::Sum, -100) / norm
             : form.vocab_chunks ? LmHeadCrossEntropyByVocabChunks(hl, wl, t, norm, chunk_tokens)
                                 : ChunkedLmHeadCrossEntropy(hl, wl, t, norm, chunk_tokens);
      loss.backward();
    };
    const double ms = TimeMs(run, 5);
    hl.mutable_grad().reset();
    wl.mutable_grad().reset();
    c10::cuda::device_synchronize();
    const int64_t before = Allocated();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    run();
    c10::cuda::device_synchronize();
    const int64_t peak_extra = PeakAllocated() - before;
    const int64_t grads = hl.grad().nbytes() + wl.grad().nbytes();
    double err_loss = 0, err_gh = 0, err_gw = 0;
    if (!ref_loss.defined()) {
      ref_loss = loss.detach().clone();
      ref_gh = hl.grad().clone();
      ref_gw = wl.grad().clone();
    } else {
      err_loss = RelErr(loss.detach(), ref_loss);
      err_gh = RelErr(hl.grad(), ref_gh);
      err_gw = RelErr(wl.grad(), ref_gw);
    }
    const double full_logits_fp32 = double(tokens) * vocab * 4;
    const double flops = 2.0 * 3 * tokens * vocab * hidden;  // forward + two backward GEMMs
    std::printf(
        "{\"bench\": \"lm_head_loss\", \"form\": \"%s\", \"tokens\": %lld, \"hidden\": %lld, \"vocab\": %lld, "
        "\"chunk_tokens\": %lld, \"dtype\": \"bf16\", \"fwd_bwd_ms\": %.2f, \"tflops_3gemm\": %.1f, "
        "\"peak_extra_bytes\": %lld, \"gradient_bytes\": %lld, \"working_bytes\": %lld, "
        "\"full_logits_fp32_bytes\": %.0f, \"working_over_full_logits\": %.4f, \"rel_err_vs_full\": {\"loss\": %.3g, "
        "\"grad_h\": %.3g, \"grad_w\": %.3g}, \"grad_accumulation\": \"%s\", \"note\": \"peak_extra = peak "
        "allocated during forward+backward "
        "above the inputs; working = peak_extra - the returned gradients\"}\n",
        form.name, (long long)tokens, (long long)hidden, (long long)vocab, (long long)chunk_tokens, ms,
        flops / ms / 1e9, (long long)peak_extra, (long long)grads, (long long)(peak_extra - grads), full_logits_fp32,
        (peak_extra - grads) / full_logits_fp32, err_loss, err_gh, err_gw,
        form.kernels ? LmHeadGradientAccumulation(true) : "-");
    std::fflush(stdout);
  }
}

void BenchNf4(int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  const c10::Device cuda(c10::kCUDA, 0);
  for (bool double_quant : {false, true}) {
    at::manual_seed(7);
    const Nf4Tensors host = QuantizeNf4Tensor(at::randn({n}, at::kBFloat16) * 0.02, double_quant);
    const Nf4Tensors dev = host.To(cuda);
    at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kBFloat16).device(cuda));
    // Checked first: the kernel against the CPU routine (a 1 M-element prefix keeps the CPU side short).
    const int64_t check = std::min<int64_t>(n, int64_t{1} << 20);
    Nf4Tensors head = host;
    head.numel = check;
    head.packed = host.packed.narrow(0, 0, check / 2).contiguous();
    if (double_quant) {
      head.stats_codes = host.stats_codes.narrow(0, 0, check / 64).contiguous();
      head.absmax2 = host.absmax2.narrow(0, 0, (check / 64 + 255) / 256).contiguous();
    } else {
      head.absmax = host.absmax.narrow(0, 0, check / 64).contiguous();
    }
    at::Tensor want = at::empty({check}, at::kBFloat16);
    DequantizeNf4Into(head, want);
    DequantizeNf4Into(dev, out);
    const bool equal = at::equal(out.narrow(0, 0, check).cpu(), want);
    const double ms = TimeMs([&] { DequantizeNf4Into(dev, out); });
    const double bytes = static_cast<double>(host.bytes()) + 2.0 * static_cast<double>(n);  // read + bf16 written
    std::printf(
        "{\"bench\": \"kernel\", \"kernel\": \"nf4_dequant\", \"shape\": \"%lldx%lld\", \"double_quant\": %s, "
        "\"bit_equal_to_cpu\": %s, \"ms\": %.4f, \"gb_s\": %.0f, \"pct_of_copy\": %.1f, \"bf16_weights_gb_s\": %.0f, "
        "\"copy_gb_s\": %.0f}\n",
        static_cast<long long>(rows), static_cast<long long>(cols), double_quant ? "true" : "false",
        equal ? "true" : "false", ms, bytes / ms / 1e6, 100 * bytes / ms / 1e6 / g_copy_gbps, 2.0 * n / ms / 1e6,
        g_copy_gbps);
    std::fflush(stdout);
    if (!equal) std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 8192;
  if (argc > 2) g_copy_gbps = std::atof(argv[2]);
  const std::string only = argc > 3 ? argv[3] : "";  // one kernel family: rmsnorm, rope, swiglu, convert, ce, lm_head
  auto wanted = [&](const char* name) { return only.empty() || only == name; };
  if (!only.empty() && !wanted("rmsnorm") && !wanted("rope") && !wanted("swiglu") && !wanted("convert") &&
      !wanted("ce") && !wanted("lm_head") && !wanted("nf4")) {
    std::fprintf(stderr,
                 "kernel_bench: unknown kernel family '%s' (rmsnorm, rope, swiglu, convert, ce, lm_head, nf4)\n",
                 only.c_str());
    return 2;
  }
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "kernel_bench: no CUDA device\n");
    return 2;
  }
  std::fprintf(stderr, "kernel_bench on %s\n", DescribeDevice().description.c_str());
  // Llama-3.1-8B: hidden 4096, 32 query heads and 8 key/value heads of 128, MLP 14336, vocabulary 128256.
  if (wanted("rmsnorm")) BenchRmsNorm(tokens, 4096);
  if (wanted("rope")) BenchRope(tokens, 32, 128);
  if (wanted("rope")) BenchRope(tokens, 8, 128);
  if (wanted("swiglu")) BenchSwiGlu(tokens, 14336);
  if (wanted("convert")) BenchConvert(128256, 4096);
  if (wanted("ce")) BenchCrossEntropyRows(tokens, 128256 / 8, 128256);
  // The head at another hidden size (argv[4]; Llama-3.2-3B: 3072).
  if (wanted("lm_head")) BenchLmHead(tokens, argc > 4 ? std::atoll(argv[4]) : 4096, 128256, 1024);
  if (wanted("nf4")) BenchNf4(8192, 28672);
  return 0;
}
