// Fused, chunked LM head + token cross-entropy. The forward walks the tokens in chunks; per chunk it forms
// that chunk's logits against the whole vocabulary, adds its loss, and (when gradients are needed) immediately
// turns softmax - onehot into the chunk's input gradient and adds its share of the weight gradient in fp32. Peak
// extra memory is one chunk of logits and the fp32 weight gradient instead of [tokens, vocab]; backward only scales
// the saved gradients.
#pragma once

#include <ATen/core/Tensor.h>

namespace slide {

// h [N, H], weight [V, H] (same dtype), targets [N] int64: -100 = ignore, every other target in [0, V) (the
// trainers check this on the host, CheckedTargetCount; both forms count any target outside [0, V) as ignored
// rather than read out of bounds). The row operations are the fused kernels on CUDA (a chunk then holds 4x
// chunk_tokens tokens in bf16, 3x in fp32: the bytes of chunk_tokens tokens' unfused working set).
// Returns sum over valid targets of CE / normalizer, an fp32 scalar, differentiable w.r.t. h and weight.
at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                     double normalizer, int64_t chunk_tokens);

// The vocabulary-chunked form: every token at once against chunks of the vocabulary holding as many logits as
// chunk_tokens * V, with the same row operations. One more GEMM than the token-chunked form (each chunk's logits
// are formed again for its gradient), but no fp32 [V, H] weight-gradient sum: the lower-memory form, kept for
// kernel_bench's comparison and tested beside the other.
at::Tensor LmHeadCrossEntropyByVocabChunks(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                           double normalizer, int64_t chunk_tokens);

// How either form summed a gradient of bf16 operands over its chunks on CUDA (or the CPU): "fp32" (cuBLAS with
// fp32 output, rounded once), "bf16_product_per_chunk" (where addmm's out_dtype overload is missing: each chunk's
// product rounded to bf16, then summed in fp32), or "unused".
const char* LmHeadGradientAccumulation(bool cuda);

}  // namespace slide
