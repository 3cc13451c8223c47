// A model's special tokens as transformers' tokenizer reads them: tokenizer_config.json, overridden by
// special_tokens_map.json where that names one; the EOS from generation_config.json's eos_token_id only when
// neither file names one. Chat templates receive them as bos_token, eos_token, ...; text samples get the BOS and EOS.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "engine/common/status.h"

namespace slide {

class Tokenizer;

struct SpecialTokens {
  std::string bos_token;  // "" = unset
  std::string eos_token;
  std::string pad_token;
  std::string unk_token;
  std::optional<bool> add_bos_token;  // tokenizer_config.json's flag, when it has one

  // The tokens transformers passes a chat template (its special_tokens_map: only those that are set).
  void AddTo(nlohmann::ordered_json& variables) const;
};

// Reads `model_dir`'s files (each optional). `tokenizer` turns generation_config.json's eos_token_id into its name;
// null skips that fallback. A malformed file or field is INVALID_ARGUMENT naming it.
StatusOr<SpecialTokens> LoadSpecialTokens(const std::string& model_dir, const Tokenizer* tokenizer);

}  // namespace slide
