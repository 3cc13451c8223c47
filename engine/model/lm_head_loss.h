// Fused, chunked LM head + token cross-entropy. The forward walks the tokens in chunks; per chunk it forms
// that chunk's logits (fp32), adds its loss, and (when gradients are needed) immediately turns
// softmax - onehot into the chunk's input gradient and accumulates the weight gradient in fp32. Peak extra
// memory is one chunk of logits instead of [tokens, vocab]; backward only scales the saved gradients.
#pragma once

#include <ATen/core/Tensor.h>

namespace slide {

// On CUDA tensors with the fused kernels on, this runs LmHeadCrossEntropyByVocabChunks.
// h [N, H], weight [V, H] (same dtype), targets [N] int64 with -100 = ignore.
// Returns sum over valid targets of CE / normalizer, an fp32 scalar, differentiable w.r.t. h and weight.
at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                     double normalizer, int64_t chunk_tokens);

// The vocabulary-chunked form: every token at once against chunks of the vocabulary holding as many logits as
// chunk_tokens * V, with the cross-entropy row operations as CUDA kernels (ATen ops off CUDA). The weight
// gradient is one fp32-accumulated GEMM per chunk, rounded once.
at::Tensor LmHeadCrossEntropyByVocabChunks(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                           double normalizer, int64_t chunk_tokens);

}  // namespace slide
