#include "engine/common/utf8.h"

#include <algorithm>
#include <cstdint>

namespace slide {

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t n;
    uint32_t min;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 0x6) {
      n = 2, min = 0x80;
    } else if ((c >> 4) == 0xE) {
      n = 3, min = 0x800;
    } else if ((c >> 3) == 0x1E) {
      n = 4, min = 0x10000;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    uint32_t cp = c & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// Replaces each invalid sequence (a bad lead byte together with the continuation bytes after it) with U+FFFD.
// Rust's from_utf8_lossy, which HF decoders use, gives one U+FFFD per stray continuation byte instead.
std::string Utf8Lossy(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t n = Utf8Len(static_cast<unsigned char>(s[i]));
    if (IsValidUtf8(s.substr(i, std::min(n, s.size() - i))) && i + n <= s.size()) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
      while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    }
  }
  return out;
}

}  // namespace slide
