#include "engine/model/peft_adapter.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <set>

#include "engine/data/json_file.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/model/safetensors.h"

namespace slide {
namespace {

using nlohmann::json;

constexpr char kConfigFile[] = "adapter_config.json";
constexpr char kWeightsFile[] = "adapter_model.safetensors";

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A field PEFT may write that this engine does not train unless it has its neutral value.
bool Neutral(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
         (v.is_array() && v.empty()) || (v.is_string() && v.get<std::string>() == "none");
}

StatusOr<LoraOptions> ParseConfig(const json& c, const std::string& path) {
  auto bad = [&](const std::string& what) { return InvalidArgument(path + ": " + what); };
  if (!c.is_object()) return bad("not a JSON object");
  if (c.value("peft_type", std::string()) != "LORA")
    return bad("peft_type must be \"LORA\" (got " + (c.contains("peft_type") ? c["peft_type"].dump() : "none") + ")");
  for (const char* field : {"use_dora", "use_rslora", "fan_in_fan_out", "rank_pattern", "alpha_pattern",
                            "layers_to_transform", "modules_to_save", "lora_bias", "bias", "exclude_modules",
                            "layer_replication", "trainable_token_indices", "target_parameters", "use_qalora"}) {
    if (c.contains(field) && !Neutral(c[field]))
      return bad(std::string(field) + " = " + c[field].dump() + " is not supported (plain LoRA only)");
  }
  LoraOptions lora;
  if (!c.contains("r") || !c["r"].is_number_integer()) return bad("r must be an integer");
  lora.r = c["r"].get<int64_t>();
  if (!c.contains("lora_alpha") || !c["lora_alpha"].is_number()) return bad("lora_alpha must be a number");
  lora.alpha = c["lora_alpha"].get<double>();
  if (c.contains("lora_dropout") && !c["lora_dropout"].is_null()) {
    if (!c["lora_dropout"].is_number()) return bad("lora_dropout must be a number");
    lora.dropout = c["lora_dropout"].get<double>();
  }
  const json& t = c.contains("target_modules") ? c["target_modules"] : json();
  if (t.is_string() && t.get<std::string>() == "all-linear") {
    lora.target_modules = LoraModuleNames();
  } else if (t.is_array()) {
    lora.target_modules.clear();
    for (const json& name : t) {
      if (!name.is_string()) return bad("target_modules must list module names");
      lora.target_modules.push_back(name.get<std::string>());
    }
  } else {
    return bad(
        "target_modules must be a list of module names or \"all-linear\" (regular expressions are not "
        "supported)");
  }
  return lora;
}

}  // namespace

StatusOr<PeftAdapter> LoadPeftAdapter(const std::string& dir, const ModelConfig& cfg) {
  const std::string config_path = dir + "/" + kConfigFile;
  SLIDE_ASSIGN_OR_RETURN(const json config, ReadOptionalJsonObject(config_path));
  if (config.is_null()) return InvalidArgument(config_path + " does not exist: not a PEFT adapter directory");
  PeftAdapter adapter;
  SLIDE_ASSIGN_OR_RETURN(adapter.lora, ParseConfig(config, config_path));
  if (Status st = ValidateLoraOptions(adapter.lora, cfg); !st.ok())
    return InvalidArgument(config_path + ": " + st.message());

  const std::string weights_path = dir + "/" + kWeightsFile;
  SLIDE_ASSIGN_OR_RETURN(const auto file, SafetensorsFile::Open(weights_path));
  const AdapterLayout layout = BuildAdapterLayout(cfg, adapter.lora);
  std::set<std::string> expected;
  for (const UnitLayout& unit : layout.layers) {
    at::Tensor flat = at::zeros({unit.numel}, at::kFloat);
    for (const ParamSpec& p : unit.params) {
      expected.insert(p.name);
      const SafetensorsEntry* entry = file->Find(p.name);
      if (entry == nullptr) return InvalidArgument(weights_path + ": tensor " + p.name + " is missing");
      if (entry->shape != p.shape)
        return InvalidArgument(weights_path + ": tensor " + p.name + " has shape " + ShapeText(entry->shape) +
                               ", the adapter needs " + ShapeText(p.shape));
      if (!at::isFloatingType(entry->dtype))
        return InvalidArgument(weights_path + ": tensor " + p.name + " is not floating point");
      SLIDE_ASSIGN_OR_RETURN(at::Tensor value, file->Read(*entry));
      if (!AllFinite(value)) return InvalidArgument(weights_path + ": tensor " + p.name + " is not finite");
      ParamView(p, flat).copy_(value);
    }
    adapter.layers.push_back(flat);
  }
  for (const SafetensorsEntry& e : file->entries())
    if (expected.count(e.name) == 0)
      return InvalidArgument(weights_path + ": tensor " + e.name + " is not part of a LoRA adapter with r " +
                             std::to_string(adapter.lora.r) + " on the targets its config names");
  return adapter;
}

std::string PeftAdapterConfigJson(const LoraOptions& lora, const std::string& base_model) {
  json c = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"base_model_name_or_path", base_model},
            {"r", lora.r},
            {"lora_alpha", lora.alpha},
            {"lora_dropout", lora.dropout},
            {"target_modules", lora.target_modules},
            {"bias", "none"},
            {"fan_in_fan_out", false},
            {"inference_mode", true},
            {"init_lora_weights", true},
            {"use_rslora", false},
            {"use_dora", false},
            {"modules_to_save", nullptr},
            {"layers_to_transform", nullptr},
            {"rank_pattern", json::object()},
            {"alpha_pattern", json::object()}};
  return c.dump(2) + "\n";
}

Status ExportPeftAdapter(const OutputDirectory& out, const LoraOptions& lora, const AdapterLayout& layout,
                         const std::vector<at::Tensor>& layers, const std::string& base_model, c10::ScalarType dtype) {
  if (layers.size() != layout.layers.size()) return Internal("an adapter buffer per layer is needed to export");
  NamedTensors tensors;
  for (size_t i = 0; i < layers.size(); ++i)
    for (const ParamSpec& p : layout.layers[i].params) tensors.emplace_back(p.name, ParamView(p, layers[i]).to(dtype));
  SLIDE_RETURN_IF_ERROR(WriteSafetensorsAt(out.fd(), kWeightsFile, StreamedFrom(tensors)));
  return out.WriteFileAtomic(kConfigFile, PeftAdapterConfigJson(lora, base_model));
}

}  // namespace slide
