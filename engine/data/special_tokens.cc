#include "engine/data/special_tokens.h"

#include <nlohmann/json.hpp>

#include "engine/data/json_file.h"
#include "engine/data/tokenizer.h"

namespace slide {
namespace {

using nlohmann::json;

// A token field: a string, or an AddedToken object {"content": ...}; null or absent leaves `out` as it was.
Status TokenField(const json& j, const std::string& path, const char* key, std::string& out) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return Status::Ok();
  const json& v = j[key];
  if (v.is_string()) {
    out = v.get<std::string>();
  } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    out = v["content"].get<std::string>();
  } else {
    return InvalidArgument(path + ": field '" + key + "' must be a string or {\"content\": ...}");
  }
  return Status::Ok();
}

}  // namespace

void SpecialTokens::AddTo(nlohmann::ordered_json& variables) const {
  const std::pair<const char*, const std::string*> fields[] = {
      {"bos_token", &bos_token}, {"eos_token", &eos_token}, {"unk_token", &unk_token}, {"pad_token", &pad_token}};
  for (const auto& [key, value] : fields)
    if (!value->empty()) variables[key] = *value;
}

StatusOr<SpecialTokens> LoadSpecialTokens(const std::string& model_dir, const Tokenizer* tokenizer) {
  SpecialTokens t;
  const char* keys[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
  std::string* fields[] = {&t.bos_token, &t.eos_token, &t.pad_token, &t.unk_token};
  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {  // the map overrides the config
    const std::string path = model_dir + "/" + file;
    SLIDE_ASSIGN_OR_RETURN(json j, ReadOptionalJsonObject(path));
    for (int i = 0; i < 4; ++i) SLIDE_RETURN_IF_ERROR(TokenField(j, path, keys[i], *fields[i]));
    if (j.is_object() && j.contains("add_bos_token") && j["add_bos_token"].is_boolean())
      t.add_bos_token = j["add_bos_token"].get<bool>();
  }
  if (t.eos_token.empty() && tokenizer != nullptr) {
    const std::string path = model_dir + "/generation_config.json";
    SLIDE_ASSIGN_OR_RETURN(json g, ReadOptionalJsonObject(path));
    if (g.is_object() && g.contains("eos_token_id")) {
      const json& id =
          g["eos_token_id"].is_array() && !g["eos_token_id"].empty() ? g["eos_token_id"][0] : g["eos_token_id"];
      if (!id.is_number_integer())
        return InvalidArgument(path + ": field 'eos_token_id' must be an integer or a list of them");
      const int64_t v = id.get<int64_t>();
      if (v < 0 || v >= tokenizer->vocab_size())
        return InvalidArgument(path + ": eos_token_id " + std::to_string(v) + " is outside the tokenizer's vocabulary");
      t.eos_token = tokenizer->TokenText(static_cast<int32_t>(v));
    }
  }
  return t;
}

}  // namespace slide
