// Text helpers of the tokenizer: UTF-8 encode/decode of one code point, GPT-2's byte <-> printable code point
// table (ByteLevel), and PCRE2 regexes with Unicode properties (the Split pre-tokenizer).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/common/status.h"

struct pcre2_real_code_8;

namespace slide::tokenizer_detail {

// Every occurrence of `from` replaced by `to` (an empty `from` matches nothing).
std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to);

void AppendUtf8(std::string& out, uint32_t cp);
// The code point starting at s[i] (valid UTF-8); advances i past it.
uint32_t DecodeUtf8(std::string_view s, size_t& i);

// GPT-2's reversible byte -> printable code point map used by ByteLevel.
struct ByteLevelTable {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  std::string byte_to_str[256];
  ByteLevelTable();
};
const ByteLevelTable& ByteLevel();

// The GPT-2 pre-tokenizer pattern (ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

class Regex {
 public:
  static StatusOr<std::shared_ptr<Regex>> Compile(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Isolated split: every match and every gap between matches becomes a piece.
  void Split(std::string_view s, std::vector<std::string>& out) const;

 private:
  Regex() = default;
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace slide::tokenizer_detail
