// The tokenizer.json pipeline components (normalizers, pre-tokenizers, decoders, added tokens) and their
// parsers. Each parser appends the component's steps (a Sequence flattens) or names what is not supported.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/data/tokenizer_text.h"

namespace slide::tokenizer_detail {

struct NormalizerStep {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string a, b;  // prepend: a; replace: a -> b
};

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind;
  std::shared_ptr<Regex> regex = nullptr;  // split, or byte-level with use_regex
  bool add_prefix_space = false;
  std::string replacement = "\xE2\x96\x81";  // metaspace "▁"
  std::string prepend_scheme = "always";
  bool split = true;
};

struct DecoderStep {
  enum Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string a = {}, b = {};  // Replace: pattern and content
  std::string prepend_scheme = "always";
  size_t start = 0, stop = 0;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

// A token id: an integer in [0, 2^31); anything else throws nlohmann::json::type_error.
int32_t TokenIdValue(const nlohmann::json& v);

Status ParseNormalizer(const nlohmann::json& n, std::vector<NormalizerStep>& out);
Status ParsePreTokenizer(const nlohmann::json& p, std::vector<PreTokenizerStep>& out);
Status ParseDecoder(const nlohmann::json& d, std::vector<DecoderStep>& out);
// TemplateProcessing's single sequence: the special token ids before and after $A.
Status ParsePostProcessor(const nlohmann::json& p, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix);

}  // namespace slide::tokenizer_detail
