// Fused, chunked LM head + token cross-entropy. The forward walks the tokens in chunks; per chunk it forms
// that chunk's logits (fp32), adds its loss, and (when gradients are needed) immediately turns
// softmax - onehot into the chunk's input gradient and accumulates the weight gradient in fp32. Peak extra
// memory is one chunk of logits instead of [tokens, vocab]; backward only scales the saved gradients.
#pragma once

#include <ATen/core/Tensor.h>

namespace slide {

// On CUDA tensors with the fused kernels on, this runs LmHeadCrossEntropyByVocabChunks.
// h [N, H], weight [V, H] (same dtype), targets [N] int64: -100 = ignore, every other target in [0, V) (the
// trainers check this on the host, CheckedTargetCount; the token-chunked form fails on a target >= V, the
// vocabulary-chunked one counts any target outside [0, V) as ignored rather than read out of bounds).
// Returns sum over valid targets of CE / normalizer, an fp32 scalar, differentiable w.r.t. h and weight.
at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                     double normalizer, int64_t chunk_tokens);

// The vocabulary-chunked form: every token at once against chunks of the vocabulary holding as many logits as
// chunk_tokens * V, with the cross-entropy row operations as CUDA kernels (ATen ops off CUDA). The weight
// gradient is one fp32-accumulated GEMM per chunk, rounded once.
at::Tensor LmHeadCrossEntropyByVocabChunks(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                           double normalizer, int64_t chunk_tokens);

// How the vocabulary-chunked form accumulated the input gradient of bf16 operands over the chunks on CUDA (or the
// CPU): "fp32" (cuBLAS with fp32 output, rounded once), "bf16_product_per_chunk" (where addmm's out_dtype
// overload is missing: each chunk's product rounded to bf16, then summed in fp32), or "unused".
const char* LmHeadInputGradientAccumulation(bool cuda);

}  // namespace slide
