#include "client/terminal_text.h"

#include <cstdint>
#include <cstdio>

namespace slidectl {
namespace {

// The UTF-8 sequence at text[i] (its length, 0 when invalid) and its code point.
size_t DecodeOne(std::string_view text, size_t i, uint32_t* cp) {
  const auto c = static_cast<unsigned char>(text[i]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > text.size()) return 0;
  uint32_t v = len == 1 ? c : c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  *cp = v;
  return len;
}

bool Dangerous(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069) ||
         cp == 0x200E || cp == 0x200F || cp == 0x061C;
}

}  // namespace

std::string Printable(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t len = DecodeOne(text, i, &cp);
    if (len == 0) {  // a byte that starts no valid character
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(text[i]));
      out += buf;
      ++i;
      continue;
    }
    if (keep_newlines && (cp == '\n' || cp == '\t')) {
      out += static_cast<char>(cp);
    } else if (Dangerous(cp)) {
      std::snprintf(buf, sizeof(buf), cp < 0x100 ? "\\x%02x" : "\\u%04x", cp);
      out += buf;
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

}  // namespace slidectl
