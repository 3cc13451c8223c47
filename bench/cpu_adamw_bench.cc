// Benchmark: fused CPU AdamW (bf16 grad in, fp32 master + moments updated, bf16 weight out) per SIMD level, and
// its weights-only pass (state read, only the bf16 weight written: the weights-first schedule's short pass) at the
// best level, against PyTorch's fused CPU AdamW (at::_fused_adamw_, fp32 grads, no bf16 output) on the same data;
// then the 8-bit AdamW (adamw_8bit.h: byte moments with a block absmax) per SIMD level it has, on one thread, its
// weights-only pass, and the code search (code_search.h) alone.
// Checks first (one step of each against the ATen reference), then times. Prints one JSON line.
// Usage: cpu_adamw_bench [params (default 2^28)] [repeats (default 5)]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/memory/host_array.h"
#include "engine/optim/adamw_8bit.h"
#include "engine/optim/code_search.h"
#include "engine/optim/cpu_adamw.h"

using namespace slide;

namespace {

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The fastest of `repeats` runs of fn(r), r = 0, 1, ...
template <typename Fn>
double BestSeconds(int repeats, const Fn& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn(r);
    best = std::min(best, Seconds(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t(1) << 28);
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int threads = at::get_num_threads();
  AdamWHyper hp{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

  // SLIDE_HUGE_PAGES=0: the arrays on small pages (the engine's host state is on huge pages by default).
  const char* huge_env = std::getenv("SLIDE_HUGE_PAGES");
  const bool huge = huge_env == nullptr || std::string(huge_env) != "0";
  at::Tensor p = HostArray(n, at::kFloat, huge), m = HostArray(n, at::kFloat, huge), v = HostArray(n, at::kFloat, huge);
  p.normal_(0, 0.02);
  at::Tensor g32 = at::randn({n}) * 1e-3, g16 = HostArray(n, at::kBFloat16, huge),
             out = HostArray(n, at::kBFloat16, huge);
  g16.copy_(g32);

  // Check: one step on a slice equals the reference.
  {
    const int64_t k = std::min<int64_t>(n, 1 << 20);
    at::Tensor rp = p.narrow(0, 0, k).clone(), rm = m.narrow(0, 0, k).clone(), rv = v.narrow(0, 0, k).clone();
    at::Tensor cp = rp.clone(), cm = rm.clone(), cv = rv.clone();
    AdamWReferenceStep(rp, g16.narrow(0, 0, k).to(at::kFloat), rm, rv, hp, 1);
    CpuAdamW({cp.data_ptr<float>(), cm.data_ptr<float>(), cv.data_ptr<float>(),
              reinterpret_cast<const c10::BFloat16*>(g16.data_ptr()), nullptr, nullptr, k},
             {hp, 1, 1.0f}, DetectSimdLevel());
    const double err = (cp - rp).abs().max().item<double>();
    if (err > 1e-6) {
      std::fprintf(stderr, "check failed: max |diff| %.3e\n", err);
      return 1;
    }
  }

  std::string results;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(DetectSimdLevel())) continue;
    AdamWSpan span{p.data_ptr<float>(),
                   m.data_ptr<float>(),
                   v.data_ptr<float>(),
                   reinterpret_cast<const c10::BFloat16*>(g16.data_ptr()),
                   nullptr,
                   reinterpret_cast<c10::BFloat16*>(out.data_ptr()),
                   n};
    CpuAdamW(span, {hp, 1, 1.0f}, level);  // warm-up (page faults)
    double best = BestSeconds(repeats, [&](int r) { CpuAdamW(span, {hp, r + 2, 1.0f}, level); });
    char buf[128];
    std::snprintf(buf, sizeof(buf), "\"slide_%s_gparam_s\": %.3f, ", SimdLevelName(level), n / best / 1e9);
    results += buf;
    if (level != DetectSimdLevel()) continue;
    AdamWSpan weights_only = span;
    weights_only.weights_only = true;
    best = BestSeconds(repeats, [&](int) { CpuAdamW(weights_only, {hp, repeats + 2, 1.0f}, level); });
    std::snprintf(buf, sizeof(buf), "\"slide_%s_weights_only_gparam_s\": %.3f, ", SimdLevelName(level), n / best / 1e9);
    results += buf;
  }

  {
    at::Tensor q1 = HostArray(n, at::kByte, huge), q2 = HostArray(n, at::kByte, huge);
    const int64_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
    at::Tensor a1 = HostArray(blocks, at::kFloat, huge), a2 = HostArray(blocks, at::kFloat, huge);
    const AdamW8bitSpan span{.param = p.data_ptr<float>(),
                             .exp_avg = q1.data_ptr<uint8_t>(),
                             .exp_avg_absmax = a1.data_ptr<float>(),
                             .exp_avg_sq = q2.data_ptr<uint8_t>(),
                             .exp_avg_sq_absmax = a2.data_ptr<float>(),
                             .grad_bf16 = reinterpret_cast<const c10::BFloat16*>(g16.data_ptr()),
                             .out_bf16 = reinterpret_cast<c10::BFloat16*>(out.data_ptr()),
                             .n = n};
    for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
      if (static_cast<int>(level) > static_cast<int>(DetectSimdLevel())) continue;
      CpuAdamW8bit(span, {hp, 1, 1.0f}, level);  // warm-up (page faults), non-zero state for the timed steps
      const double best = BestSeconds(repeats, [&](int r) { CpuAdamW8bit(span, {hp, r + 2, 1.0f}, level); });
      char buf[128];
      std::snprintf(buf, sizeof(buf), "\"slide_adamw8bit_%s_gparam_s\": %.3f, ", SimdLevelName(level), n / best / 1e9);
      results += buf;
    }
    // At the best level, on one thread (a slice of 2^24: the per-core rate) and the weights-only pass on every
    // thread, with fp32 AdamW's one-thread rate beside them.
    const int64_t slice = std::min<int64_t>(n, int64_t(1) << 24);
    {
      AdamW8bitSpan one_core = span;
      one_core.n = slice;
      const SimdLevel level = DetectSimdLevel();
      double best = BestSeconds(repeats, [&](int r) { CpuAdamW8bit(one_core, {hp, r + 2, 1.0f}, level, 1); });
      const double one = slice / best / 1e9;
      AdamW8bitSpan weights_only = span;
      weights_only.out_bf16 = nullptr;
      best = BestSeconds(repeats, [&](int r) {
        CpuAdamW8bitWeightsOnly(weights_only, 0, n, reinterpret_cast<c10::BFloat16*>(out.data_ptr()), {hp, r + 2, 1.0f},
                                level);
      });
      char buf[160];
      std::snprintf(buf, sizeof(buf),
                    "\"adamw8bit_one_thread_gparam_s\": %.3f, \"adamw8bit_weights_only_gparam_s\": %.3f, ", one,
                    n / best / 1e9);
      results += buf;
    }
    // The code search alone (one thread): 2^16 moments (a 256 KB working set, as a tile's blocks) quantised block by
    // block 256 times over, both maps: nanoseconds a value.
    {
      const at::Tensor x = at::randn({int64_t(1) << 16}) * 1e-3;
      std::vector<uint8_t> codes(x.numel());
      const double secs = BestSeconds(repeats, [&](int) {
        for (int r = 0; r < 256; ++r)
          for (int64_t b = 0; b < x.numel(); b += kQuantBlock)
            for (const auto* map : {&SignedDynamicMap(), &UnsignedDynamicMap()})
              QuantizeScaled(x.data_ptr<float>() + b, kQuantBlock, 4e-3f, *map, DetectSimdLevel(), codes.data() + b);
      });
      char buf[96];
      std::snprintf(buf, sizeof(buf), "\"code_search_ns_a_value\": %.3f, ", secs / (2.0 * 256 * x.numel()) * 1e9);
      results += buf;
    }
    AdamWSpan fp32{p.data_ptr<float>(),
                   m.data_ptr<float>(),
                   v.data_ptr<float>(),
                   reinterpret_cast<const c10::BFloat16*>(g16.data_ptr()),
                   nullptr,
                   reinterpret_cast<c10::BFloat16*>(out.data_ptr()),
                   slice};
    const double best = BestSeconds(repeats, [&](int r) { CpuAdamW(fp32, {hp, r + 2, 1.0f}, DetectSimdLevel(), 1); });
    char buf[128];
    std::snprintf(buf, sizeof(buf), "\"adamw_one_thread_gparam_s\": %.3f, ", slice / best / 1e9);
    results += buf;
  }

  at::Tensor step = at::zeros({}, at::kFloat);
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    at::_fused_adamw_({p}, {g32}, {m}, {v}, {}, {step}, hp.lr, hp.beta1, hp.beta2, hp.weight_decay, hp.eps, false,
                      false);
    if (r > 0) best = std::min(best, Seconds(t0));
  }
  std::printf(
      "{\"bench\": \"cpu_adamw\", \"params\": %lld, \"threads\": %d, \"host_huge_pages\": %s, "
      "%s\"torch_fused_adamw_fp32grad_gparam_s\": "
      "%.3f}\n",
      static_cast<long long>(n), threads, huge ? "true" : "false", results.c_str(), n / best / 1e9);
  return 0;
}
