#include "engine/model/config.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/common/files.h"

namespace slide {
namespace {

using nlohmann::json;

// Reads optional typed fields from one JSON object, remembering the first error with its field name.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  bool Has(const char* key) const { return obj_.contains(key) && !obj_[key].is_null(); }

  int64_t Int(const char* key, std::optional<int64_t> fallback, int64_t min_value = 1,
              int64_t max_value = std::numeric_limits<int64_t>::max()) {
    if (!Has(key)) {
      if (!fallback) Fail(key, "is required");
      return fallback.value_or(0);
    }
    const json& v = obj_[key];
    if (!v.is_number_integer()) {
      Fail(key, "must be an integer, got " + v.dump());
      return 0;
    }
    int64_t x = v.get<int64_t>();
    if (x < min_value || x > max_value) {
      Fail(key, "must be in [" + std::to_string(min_value) + ", " + std::to_string(max_value) + "], got " +
                    std::to_string(x));
      return min_value;  // keeps later arithmetic on this config harmless; the status carries the error
    }
    return x;
  }

  double Number(const char* key, std::optional<double> fallback, bool positive = true) {
    if (!Has(key)) {
      if (!fallback) Fail(key, "is required");
      return fallback.value_or(0);
    }
    const json& v = obj_[key];
    if (!v.is_number()) {
      Fail(key, "must be a number, got " + v.dump());
      return 0;
    }
    double x = v.get<double>();
    if (positive && !(x > 0)) Fail(key, "must be > 0, got " + v.dump());
    return x;
  }

  bool Bool(const char* key, bool fallback) {
    if (!Has(key)) return fallback;
    const json& v = obj_[key];
    if (!v.is_boolean()) {
      Fail(key, "must be true or false, got " + v.dump());
      return fallback;
    }
    return v.get<bool>();
  }

  std::string String(const char* key, const std::string& fallback) {
    if (!Has(key)) return fallback;
    const json& v = obj_[key];
    if (!v.is_string()) {
      Fail(key, "must be a string, got " + v.dump());
      return fallback;
    }
    return v.get<std::string>();
  }

  void Fail(const std::string& key, const std::string& what) {
    if (status_.ok()) status_ = InvalidArgument(source_ + ": field '" + key + "' " + what);
  }
  Status status() const { return status_; }

 private:
  const json& obj_;
  std::string source_;
  Status status_;
};

Status ParseRope(const json& root, FieldReader& top, ModelConfig& cfg, const std::string& source) {
  // transformers <= 4.x: rope_theta + rope_scaling; 5.x: rope_parameters {rope_type, rope_theta, ...}.
  const json* params = nullptr;
  std::string where = "rope_scaling";
  if (root.contains("rope_parameters") && root["rope_parameters"].is_object()) {
    params = &root["rope_parameters"];
    where = "rope_parameters";
  } else if (root.contains("rope_scaling") && !root["rope_scaling"].is_null()) {
    if (!root["rope_scaling"].is_object()) return InvalidArgument(source + ": field 'rope_scaling' must be an object");
    params = &root["rope_scaling"];
  }
  cfg.rope_theta = top.Number("rope_theta", cfg.rope_theta);
  if (params == nullptr) return Status::Ok();

  FieldReader r(*params, source + " (" + where + ")");
  cfg.rope_theta = r.Number("rope_theta", cfg.rope_theta);
  std::string type = r.String("rope_type", r.String("type", "default"));
  if (type == "default") {
    cfg.rope_scaling = RopeScaling::kNone;
  } else if (type == "linear") {
    cfg.rope_scaling = RopeScaling::kLinear;
    cfg.rope_factor = r.Number("factor", std::nullopt);
  } else if (type == "llama3") {
    cfg.rope_scaling = RopeScaling::kLlama3;
    cfg.rope_factor = r.Number("factor", std::nullopt);
    cfg.rope_low_freq_factor = r.Number("low_freq_factor", std::nullopt);
    cfg.rope_high_freq_factor = r.Number("high_freq_factor", std::nullopt);
    cfg.rope_original_max_positions =
        r.Int("original_max_position_embeddings", std::nullopt, 1, ModelLimits::max_positions);
    if (r.status().ok() && cfg.rope_high_freq_factor <= cfg.rope_low_freq_factor)
      r.Fail("high_freq_factor", "must exceed low_freq_factor");
  } else {
    r.Fail("rope_type", "'" + type + "' is not supported (supported: default, linear, llama3)");
  }
  return r.status();
}

}  // namespace

const char* ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kQwen3:
      return "qwen3";
  }
  return "unknown";
}

int64_t ModelConfig::LayerParamCount() const {
  const int64_t h = hidden_size;
  int64_t n = 2 * h;                                  // two RMSNorms
  n += h * q_dim() + 2 * h * kv_dim() + q_dim() * h;  // q, k, v, o
  n += 3 * h * intermediate_size;                     // gate, up, down
  if (qkv_bias) n += q_dim() + 2 * kv_dim();
  if (o_bias) n += h;
  if (mlp_bias) n += 2 * intermediate_size + h;
  if (qk_norm) n += 2 * head_dim;
  return n;
}

int64_t ModelConfig::TotalParamCount() const {
  int64_t n = vocab_size * hidden_size + num_layers * LayerParamCount() + hidden_size;
  if (!tie_word_embeddings) n += vocab_size * hidden_size;
  return n;
}

StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {  // a parse_error, or out_of_range: a number too large for a double
    return InvalidArgument(source + ": not valid JSON (" + e.what() + ")");
  }
  if (!root.is_object()) return InvalidArgument(source + ": expected a JSON object at top level");

  FieldReader r(root, source);
  ModelConfig cfg;
  cfg.model_type = r.String("model_type", "");
  if (cfg.model_type == "llama") {
    cfg.family = ModelFamily::kLlama;
  } else if (cfg.model_type == "mistral") {
    cfg.family = ModelFamily::kMistral;
  } else if (cfg.model_type == "qwen2") {
    cfg.family = ModelFamily::kQwen2;
  } else if (cfg.model_type == "qwen3") {
    cfg.family = ModelFamily::kQwen3;
  } else {
    SLIDE_RETURN_IF_ERROR(r.status());
    return InvalidArgument(source + ": model_type '" + cfg.model_type +
                           "' is not supported (supported: llama, mistral, qwen2, qwen3)");
  }

  using L = ModelLimits;
  cfg.vocab_size = r.Int("vocab_size", std::nullopt, 1, L::max_vocab_size);
  cfg.hidden_size = r.Int("hidden_size", std::nullopt, 1, L::max_hidden_size);
  cfg.intermediate_size = r.Int("intermediate_size", std::nullopt, 1, L::max_intermediate_size);
  cfg.num_layers = r.Int("num_hidden_layers", std::nullopt, 1, L::max_layers);
  cfg.num_heads = r.Int("num_attention_heads", std::nullopt, 1, L::max_heads);
  cfg.num_kv_heads = r.Int("num_key_value_heads", cfg.num_heads, 1, L::max_heads);
  cfg.rms_norm_eps = r.Number("rms_norm_eps", cfg.rms_norm_eps);
  cfg.max_position_embeddings = r.Int("max_position_embeddings", cfg.max_position_embeddings, 1, L::max_positions);
  cfg.tie_word_embeddings = r.Bool("tie_word_embeddings", false);
  const std::string act = r.String("hidden_act", "silu");
  if (act != "silu") r.Fail("hidden_act", "'" + act + "' is not supported (only silu)");
  SLIDE_RETURN_IF_ERROR(r.status());

  if (cfg.hidden_size % cfg.num_heads != 0 && !r.Has("head_dim"))
    return InvalidArgument(source + ": hidden_size " + std::to_string(cfg.hidden_size) +
                           " is not divisible by num_attention_heads " + std::to_string(cfg.num_heads));
  cfg.head_dim = r.Int("head_dim", cfg.hidden_size / cfg.num_heads, 1, L::max_head_dim);
  if (cfg.head_dim % 2 != 0) r.Fail("head_dim", "must be even for rotary embeddings");
  if (cfg.num_heads % cfg.num_kv_heads != 0)
    r.Fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(cfg.num_heads) + ")");

  switch (cfg.family) {
    case ModelFamily::kLlama:
      cfg.qkv_bias = cfg.o_bias = r.Bool("attention_bias", false);
      cfg.mlp_bias = r.Bool("mlp_bias", false);
      break;
    case ModelFamily::kMistral:
      if (r.Has("sliding_window")) cfg.sliding_window = r.Int("sliding_window", std::nullopt, 1, L::max_positions);
      break;
    case ModelFamily::kQwen2:
      cfg.qkv_bias = true;
      if (r.Bool("use_sliding_window", false))
        r.Fail("use_sliding_window", "true is not supported (per-layer sliding windows)");
      break;
    case ModelFamily::kQwen3:
      cfg.qkv_bias = cfg.o_bias = r.Bool("attention_bias", false);
      cfg.qk_norm = true;
      if (r.Bool("use_sliding_window", false))
        r.Fail("use_sliding_window", "true is not supported (per-layer sliding windows)");
      break;
  }
  SLIDE_RETURN_IF_ERROR(r.status());
  SLIDE_RETURN_IF_ERROR(ParseRope(root, r, cfg, source));
  return cfg;
}

StatusOr<ModelConfig> LoadHfConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  auto text = ReadFileToString(path);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound)
    return NotFound(path + ": cannot open (model directory must hold a Hugging Face config.json)");
  if (!text.ok()) return text.status();
  return ParseHfConfig(text.value(), path);
}

}  // namespace slide
