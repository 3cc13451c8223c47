// Llama-3.2-1B-, 3.2-3B- and 3.1-8B-shaped model configs (vocab 128256) for benchmarks, plus a tiny one, and
// their random initialisation (matrices N(0, 0.02), norms 1).
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/common/thread_pool.h"
#include "engine/model/config.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/model/param_layout.h"

namespace slide::bench {

// NAME is llama-1b | llama-3b | llama-8b | llama-70b | llama-100m | tiny, optionally with "@LAYERS" for that shape at
// another depth (the size ladder of the largest-model runs: llama-8b@48 is 1.05B of embeddings + 48 x 218M = 11.5B
// parameters). Unknown names, and a depth that is not a positive number, are errors.
inline StatusOr<ModelConfig> LlamaShape(const std::string& name) {
  auto make = [](int64_t h, int64_t ff, int64_t layers, int64_t heads, int64_t kv, bool tied) {
    ModelConfig c;
    c.vocab_size = 128256;
    c.hidden_size = h;
    c.intermediate_size = ff;
    c.num_layers = layers;
    c.num_heads = heads;
    c.num_kv_heads = kv;
    c.head_dim = h / heads;
    c.rope_theta = 500000.0;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = tied;
    return c;
  };
  const size_t at = name.find('@');
  const std::string base = name.substr(0, at);
  ModelConfig c;
  if (base == "llama-1b") {
    c = make(2048, 8192, 16, 32, 8, true);
  } else if (base == "llama-3b") {
    c = make(3072, 8192, 28, 24, 8, true);
  } else if (base == "llama-8b") {
    c = make(4096, 14336, 32, 32, 8, false);
  } else if (base == "llama-70b") {  // Llama-3-70B's shape (bench/shapes/llama-3-70b)
    c = make(8192, 28672, 80, 64, 8, false);
  } else if (base == "llama-100m") {  // 97.5M parameters over a vocabulary of 8,192 (the 8-bit quality run)
    c = make(768, 2048, 12, 12, 12, false);
    c.vocab_size = 8192;
  } else if (base == "tiny") {
    c = make(256, 512, 4, 4, 2, false);
    c.vocab_size = 1024;
  } else {
    return InvalidArgument("unknown shape '" + name +
                           "' (llama-1b, llama-3b, llama-8b, llama-70b, llama-100m or tiny, " +
                           "optionally @LAYERS, or a directory holding config.json)");
  }
  if (at != std::string::npos) {
    const std::string depth = name.substr(at + 1);
    char* end = nullptr;
    const long long layers = std::strtoll(depth.c_str(), &end, 10);
    if (depth.empty() || *end != '\0' || layers < 1 || layers > 1024)
      return InvalidArgument("shape '" + name + "': the depth after '@' must be 1..1024 layers");
    c.num_layers = layers;
  }
  return c;
}

// The matrices are drawn in pieces of 4M values, each from its own generator (seeded by its unit and index) on the
// process's thread pool: drawn in one stream, 8B's took ~80 s of every benchmark run's start on the GPU box.
// `dtype` bf16 draws the values in bf16 directly (a frozen base for LoRA: no fp32 copy of a 30B model on the host).
inline at::Tensor RandomLlamaUnit(const UnitLayout& unit, size_t index, c10::ScalarType dtype) {
  constexpr int64_t kPiece = int64_t(1) << 22;
  at::Tensor flat = at::zeros({unit.numel}, at::TensorOptions().dtype(dtype));
  std::vector<at::Tensor> pieces;
  for (const auto& p : unit.params) {
    at::Tensor v = ParamView(p, flat).view({-1});
    if (!p.weight_decay) {
      v.fill_(1.0);  // norms (no biases in Llama)
      continue;
    }
    for (int64_t b = 0; b < v.numel(); b += kPiece) pieces.push_back(v.narrow(0, b, std::min(kPiece, v.numel() - b)));
  }
  ThreadPool::Default().ParallelFor(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>((static_cast<uint64_t>(index) << 32) + i + 1);
    if (dtype == at::kFloat) {
      pieces[i].normal_(0, 0.02, gen);
    } else {  // drawn in fp32 and rounded: ATen draws bf16 normals ~6x slower than fp32 ones
      pieces[i].copy_(at::empty({pieces[i].numel()}, at::kFloat).normal_(0, 0.02, gen));
    }
  });
  return flat;
}

inline ModelParams RandomLlamaParams(const ModelConfig& cfg, c10::ScalarType dtype = at::kFloat) {
  ModelParams init;
  init.layout = BuildModelLayout(cfg);
  for (size_t u = 0; u < init.layout.units.size(); ++u)
    init.units.push_back(RandomLlamaUnit(init.layout.units[u], u, dtype));
  return init;
}

}  // namespace slide::bench
