// The Llama-family forward pass, unit by unit. Every function is differentiable with autograd: the sliding
// engine recomputes a unit's forward under autograd and calls backward on it alone; the reference trainer
// chains the units into one graph. Weights come as a unit's flat buffer plus its layout (views are taken
// inside), so a unit's gradient lands in one flat buffer too. Compute runs in the weights' dtype. RMSNorm, RoPE,
// SwiGLU and the loss run as fused CUDA kernels on the GPU (engine/kernels/fused_ops.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "engine/model/config.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/model/lora.h"
#include "engine/model/param_layout.h"

namespace slide {

// Rotary tables for positions 0..S-1: cos and sin, each [S, head_dim] in `dtype`.
struct RopeTables {
  at::Tensor cos;
  at::Tensor sin;
};
at::Tensor RopeInverseFrequencies(const ModelConfig& cfg);  // [head_dim/2] fp32, scaling applied
RopeTables BuildRopeTables(const ModelConfig& cfg, int64_t seq_len, at::TensorOptions options);

// ids [B, S] int64 -> hidden [B, S, H]
at::Tensor EmbeddingForward(const UnitLayout& layout, const at::Tensor& flat, const at::Tensor& ids);

// x [B, S, H] -> [B, S, H]: pre-norm attention (GQA, RoPE, causal) and SwiGLU MLP, each with a residual; with
// `adapter`, its LoRA terms added to the projections it targets.
at::Tensor DecoderLayerForward(const ModelConfig& cfg, const UnitLayout& layout, const at::Tensor& flat,
                               const at::Tensor& x, const RopeTables& rope, const LayerAdapter* adapter = nullptr);

// The LM head matrix [V, H]: the head unit's own, or the embedding's when tied.
at::Tensor LmHeadWeight(const ModelLayout& layout, const at::Tensor& embed_flat, const at::Tensor& head_flat);

struct LossOptions {
  int64_t chunk_tokens = 1024;  // tokens per LM-head chunk: logits exist for one chunk at a time
};

// Final norm + LM head + token cross-entropy. targets [B, S] (already shifted; -100 = ignored).
// Returns sum(CE over valid targets) / normalizer as an fp32 scalar; never materialises [B*S, V] logits.
at::Tensor HeadLoss(const ModelConfig& cfg, const UnitLayout& head_layout, const at::Tensor& head_flat,
                    const at::Tensor& lm_head_weight, const at::Tensor& x, const at::Tensor& targets, double normalizer,
                    const LossOptions& options = {});

// Full logits [B, S, V] in fp32 (small models and tests only).
at::Tensor HeadLogits(const ModelConfig& cfg, const UnitLayout& head_layout, const at::Tensor& head_flat,
                      const at::Tensor& lm_head_weight, const at::Tensor& x);

// The whole model in one autograd graph over `params` (the oracle and parity tests use this); `adapters`, when
// given, one per layer.
at::Tensor ModelLoss(const ModelConfig& cfg, const ModelParams& params, const at::Tensor& ids,
                     const at::Tensor& targets, double normalizer, const LossOptions& options = {},
                     const std::vector<LayerAdapter>* adapters = nullptr);
at::Tensor ModelLogits(const ModelConfig& cfg, const ModelParams& params, const at::Tensor& ids,
                       const std::vector<LayerAdapter>* adapters = nullptr);

// Number of targets that count (!= -100).
int64_t CountValidTargets(const at::Tensor& targets);
// The same after checking that every target is -100 or in [0, vocab) (a c10::Error naming the first bad one
// otherwise): the trainers call it on the host batch before anything reaches the device.
int64_t CheckedTargetCount(const at::Tensor& targets, int64_t vocab);

constexpr int64_t kIgnoreIndex = -100;

}  // namespace slide
