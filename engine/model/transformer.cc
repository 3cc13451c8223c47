#include "engine/model/transformer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "engine/kernels/fused_ops.h"
#include "engine/model/lm_head_loss.h"

namespace slide {
namespace {

at::Tensor P(const UnitLayout& layout, const at::Tensor& flat, const char* local) {
  const ParamSpec* spec = layout.Find(local);
  return spec == nullptr ? at::Tensor() : ParamView(*spec, flat);
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

}  // namespace

at::Tensor RopeInverseFrequencies(const ModelConfig& cfg) {
  const int64_t dim = cfg.head_dim;
  at::Tensor exponent = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  at::Tensor inv_freq = at::pow(cfg.rope_theta, exponent).reciprocal();
  switch (cfg.rope_scaling) {
    case RopeScaling::kNone:
      return inv_freq;
    case RopeScaling::kLinear:
      return inv_freq / cfg.rope_factor;
    case RopeScaling::kLlama3: {
      // Llama 3.1: long wavelengths divided by `factor`, short kept, the band between interpolated.
      const double old_ctx = static_cast<double>(cfg.rope_original_max_positions);
      const double low_wavelen = old_ctx / cfg.rope_low_freq_factor;
      const double high_wavelen = old_ctx / cfg.rope_high_freq_factor;
      at::Tensor wavelen = 2 * M_PI / inv_freq;
      at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / cfg.rope_factor, inv_freq);
      at::Tensor smooth =
          (old_ctx / wavelen - cfg.rope_low_freq_factor) / (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor);
      at::Tensor smoothed = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled;
      at::Tensor medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
      return at::where(medium, smoothed, scaled);
    }
  }
  return inv_freq;
}

RopeTables BuildRopeTables(const ModelConfig& cfg, int64_t seq_len, at::TensorOptions options) {
  at::Tensor positions = at::arange(seq_len, at::kLong).to(at::kFloat);
  at::Tensor freqs = positions.unsqueeze(1) * RopeInverseFrequencies(cfg).unsqueeze(0);  // [S, D/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                                          // [S, D]
  return {emb.cos().to(options), emb.sin().to(options)};
}

at::Tensor EmbeddingForward(const UnitLayout& layout, const at::Tensor& flat, const at::Tensor& ids) {
  return at::embedding(P(layout, flat, "embed_tokens.weight"), ids);
}

at::Tensor DecoderLayerForward(const ModelConfig& cfg, const UnitLayout& layout, const at::Tensor& flat,
                               const at::Tensor& x, const RopeTables& rope, const LayerAdapter* adapter) {
  const int64_t B = x.size(0), S = x.size(1), D = cfg.head_dim;
  const double eps = cfg.rms_norm_eps;
  // A linear projection ("self_attn.q_proj") of `in`, plus its adapter's term when it has one (PEFT's order: the
  // base result first, the adapter's added to it).
  auto project = [&](const at::Tensor& in, const std::string& path) {
    at::Tensor y = Linear(in, P(layout, flat, (path + ".weight").c_str()), P(layout, flat, (path + ".bias").c_str()));
    if (adapter == nullptr) return y;
    at::Tensor delta = AdapterDelta(*adapter, path, in);
    return delta.defined() ? y + delta : y;
  };

  // Attention block.
  at::Tensor h = RmsNorm(x, P(layout, flat, "input_layernorm.weight"), eps);
  at::Tensor q = project(h, "self_attn.q_proj").view({B, S, cfg.num_heads, D});
  at::Tensor k = project(h, "self_attn.k_proj").view({B, S, cfg.num_kv_heads, D});
  at::Tensor v = project(h, "self_attn.v_proj").view({B, S, cfg.num_kv_heads, D}).transpose(1, 2);
  if (cfg.qk_norm) {
    q = RmsNorm(q, P(layout, flat, "self_attn.q_norm.weight"), eps);
    k = RmsNorm(k, P(layout, flat, "self_attn.k_norm.weight"), eps);
  }
  q = ApplyRotary(q, rope.cos, rope.sin).transpose(1, 2);  // [B, heads, S, D]
  k = ApplyRotary(k, rope.cos, rope.sin).transpose(1, 2);

  std::optional<at::Tensor> mask;
  bool causal = true;
  if (cfg.sliding_window && S > *cfg.sliding_window) {
    // Position i sees j with i - window < j <= i.
    at::Tensor i = at::arange(S, x.options().dtype(at::kLong)).unsqueeze(1);
    at::Tensor j = at::arange(S, x.options().dtype(at::kLong)).unsqueeze(0);
    mask = j.le(i).logical_and(i.sub(j).lt(*cfg.sliding_window));
    causal = false;
  }
  at::Tensor attn = at::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, 1.0 / std::sqrt(double(D)),
                                                     /*enable_gqa=*/cfg.num_heads != cfg.num_kv_heads);
  attn = attn.transpose(1, 2).reshape({B, S, cfg.q_dim()});
  at::Tensor x1 = x + project(attn, "self_attn.o_proj");

  // MLP block: down(silu(gate(h)) * up(h)).
  h = RmsNorm(x1, P(layout, flat, "post_attention_layernorm.weight"), eps);
  at::Tensor gate = project(h, "mlp.gate_proj");
  at::Tensor up = project(h, "mlp.up_proj");
  return x1 + project(SwiGlu(gate, up), "mlp.down_proj");
}

at::Tensor LmHeadWeight(const ModelLayout& layout, const at::Tensor& embed_flat, const at::Tensor& head_flat) {
  if (layout.tied_embeddings) return P(layout.embed(), embed_flat, "embed_tokens.weight");
  return P(layout.head(), head_flat, "lm_head.weight");
}

at::Tensor HeadLoss(const ModelConfig& cfg, const UnitLayout& head_layout, const at::Tensor& head_flat,
                    const at::Tensor& lm_head_weight, const at::Tensor& x, const at::Tensor& targets, double normalizer,
                    const LossOptions& options) {
  at::Tensor h = RmsNorm(x, P(head_layout, head_flat, "model.norm.weight"), cfg.rms_norm_eps);
  return ChunkedLmHeadCrossEntropy(h.reshape({-1, cfg.hidden_size}), lm_head_weight, targets.reshape({-1}), normalizer,
                                   options.chunk_tokens);
}

at::Tensor HeadLogits(const ModelConfig& cfg, const UnitLayout& head_layout, const at::Tensor& head_flat,
                      const at::Tensor& lm_head_weight, const at::Tensor& x) {
  at::Tensor h = RmsNorm(x, P(head_layout, head_flat, "model.norm.weight"), cfg.rms_norm_eps);
  return at::matmul(h, lm_head_weight.t()).to(at::kFloat);
}

namespace {
at::Tensor TrunkForward(const ModelConfig& cfg, const ModelParams& params, const at::Tensor& ids,
                        const std::vector<LayerAdapter>* adapters) {
  const ModelLayout& L = params.layout;
  TORCH_CHECK(adapters == nullptr || static_cast<int64_t>(adapters->size()) == L.num_layers(), "one adapter per layer");
  at::Tensor x = EmbeddingForward(L.embed(), params.units.front(), ids);
  RopeTables rope = BuildRopeTables(cfg, ids.size(1), x.options());
  for (int64_t i = 0; i < L.num_layers(); ++i)
    x = DecoderLayerForward(cfg, L.layer(i), params.units[1 + i], x, rope,
                            adapters == nullptr ? nullptr : &(*adapters)[i]);
  return x;
}
}  // namespace

at::Tensor ModelLoss(const ModelConfig& cfg, const ModelParams& params, const at::Tensor& ids,
                     const at::Tensor& targets, double normalizer, const LossOptions& options,
                     const std::vector<LayerAdapter>* adapters) {
  at::Tensor x = TrunkForward(cfg, params, ids, adapters);
  const ModelLayout& L = params.layout;
  return HeadLoss(cfg, L.head(), params.units.back(), LmHeadWeight(L, params.units.front(), params.units.back()), x,
                  targets, normalizer, options);
}

at::Tensor ModelLogits(const ModelConfig& cfg, const ModelParams& params, const at::Tensor& ids,
                       const std::vector<LayerAdapter>* adapters) {
  at::Tensor x = TrunkForward(cfg, params, ids, adapters);
  const ModelLayout& L = params.layout;
  return HeadLogits(cfg, L.head(), params.units.back(), LmHeadWeight(L, params.units.front(), params.units.back()), x);
}

int64_t CountValidTargets(const at::Tensor& targets) { return targets.ne(kIgnoreIndex).sum().item<int64_t>(); }

// On the host a plain loop: the trainers call this at the start of each step, while the update's threads hold
// the cores and ATen's CPU thread pool would wait for them.
int64_t CheckedTargetCount(const at::Tensor& targets, int64_t vocab) {
  if (targets.device().is_cpu()) {
    const at::Tensor t = targets.to(at::kLong).contiguous();
    const int64_t* p = t.data_ptr<int64_t>();
    int64_t valid = 0;
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      if (p[i] == kIgnoreIndex) continue;
      TORCH_CHECK(p[i] >= 0 && p[i] < vocab, "target ", p[i], " at position ", i,
                  " is neither -100 nor a token id in [0, ", vocab, ")");
      ++valid;
    }
    return valid;
  }
  const at::Tensor bad = targets.ne(kIgnoreIndex) & (targets.lt(0) | targets.ge(vocab));
  if (bad.any().item<bool>()) {
    const int64_t at = bad.reshape({-1}).nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, "target ", targets.reshape({-1})[at].item<int64_t>(), " at position ", at,
                " is neither -100 nor a token id in [0, ", vocab, ")");
  }
  return CountValidTargets(targets);
}

}  // namespace slide
