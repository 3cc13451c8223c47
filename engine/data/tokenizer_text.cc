#include "engine/data/tokenizer_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/common/utf8.h"

namespace slide::tokenizer_detail {

std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string r;
  for (size_t pos = 0;;) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) return r.append(s, pos, std::string::npos);
    r.append(s, pos, hit - pos).append(to);
    pos = hit + from.size();
  }
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t DecodeUtf8(std::string_view s, size_t& i) {
  unsigned char c = s[i];
  size_t n = Utf8Len(c);
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

ByteLevelTable::ByteLevelTable() {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    byte_to_cp[b] = printable ? b : 256 + n++;
    cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    AppendUtf8(byte_to_str[b], byte_to_cp[b]);
  }
}

const ByteLevelTable& ByteLevel() {
  static const ByteLevelTable table;
  return table;
}

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

StatusOr<std::shared_ptr<Regex>> Regex::Compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InvalidArgument("regex '" + pattern + "' does not compile at offset " + std::to_string(offset) + ": " +
                           reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back to the interpreter
  auto r = std::shared_ptr<Regex>(new Regex());
  r->code_ = code;
  return r;
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::Split(std::string_view s, std::vector<std::string>& out) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
  size_t pos = 0, last = 0;
  while (pos <= s.size()) {
    int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (b > last) out.emplace_back(s.substr(last, b - last));
    if (e > b) out.emplace_back(s.substr(b, e - b));
    last = e;
    if (e == b) {
      if (e >= s.size()) break;
      pos = e + Utf8Len(static_cast<unsigned char>(s[e]));  // empty match: step one character
    } else {
      pos = e;
    }
  }
  if (last < s.size()) out.emplace_back(s.substr(last));
  pcre2_match_data_free(md);
}

}  // namespace slide::tokenizer_detail
