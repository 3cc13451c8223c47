// ModelConfig: the decoder-only architectures slideformer trains, read from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/common/status.h"

namespace slide {

enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3 };
const char* ModelFamilyName(ModelFamily family);

enum class RopeScaling { kNone, kLinear, kLlama3 };

// The largest dimensions a config.json may declare: beyond every released model, and small enough that the
// parameter counts and the planner's byte counts (with JobSizeLimits, training_job.h) cannot overflow int64.
struct ModelLimits {
  static constexpr int64_t max_vocab_size = int64_t{1} << 24;
  static constexpr int64_t max_hidden_size = int64_t{1} << 17;
  static constexpr int64_t max_intermediate_size = int64_t{1} << 20;
  static constexpr int64_t max_layers = 1024;
  static constexpr int64_t max_heads = 4096;
  static constexpr int64_t max_head_dim = 4096;
  static constexpr int64_t max_positions = int64_t{1} << 24;
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  std::string model_type = "llama";  // as written in config.json
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // config's head_dim, else hidden_size / num_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 2048;
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;           // llama3 only
  double rope_high_freq_factor = 4.0;          // llama3 only
  int64_t rope_original_max_positions = 8192;  // llama3 only
  bool tie_word_embeddings = false;
  bool qkv_bias = false;                  // bias on q/k/v projections (Qwen2; Llama/Qwen3 attention_bias)
  bool o_bias = false;                    // bias on the output projection (Llama/Qwen3 attention_bias)
  bool mlp_bias = false;                  // bias on gate/up/down (Llama mlp_bias)
  bool qk_norm = false;                   // per-head RMSNorm on q and k before RoPE (Qwen3)
  std::optional<int64_t> sliding_window;  // Mistral; attention limited to the last N positions

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Parameter counts (the LM head counted once when tied).
  int64_t LayerParamCount() const;
  int64_t TotalParamCount() const;
};

// Parses config.json text; `source` names the file in error messages.
StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& source);
// Reads `<model_dir>/config.json`.
StatusOr<ModelConfig> LoadHfConfig(const std::string& model_dir);

}  // namespace slide
