// Tokenizer: Hugging Face tokenizer.json, natively. Supports the BPE model as the Llama, Mistral and Qwen
// families ship it: byte-level BPE with a Split regex (PCRE2) or GPT-2's ByteLevel regex, and
// SentencePiece-style BPE with byte fallback (Prepend/Replace normalizers or the Metaspace pre-tokenizer);
// NFC normalization (ICU); added and special tokens; TemplateProcessing; the matching decoders.
// Anything else in the file is refused with the component's name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status.h"

namespace slide {

class Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(const std::string& json_text, const std::string& source);
  ~Tokenizer();

  // Encodes UTF-8 text; invalid UTF-8 is an error. With add_special_tokens the post-processor's template
  // (e.g. a BOS token) is applied.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens = false) const;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int32_t vocab_size() const;                       // largest id + 1
  int32_t TokenId(const std::string& token) const;  // -1 if absent
  std::string TokenText(int32_t id) const;          // the vocabulary's string for id ("" if none)
  bool IsSpecial(int32_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slide
