// UTF-8 checks shared by the tokenizer, the dataset reader and the daemon (messages quoting users' bytes).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace slide {

// Length of the UTF-8 sequence a lead byte starts (assumes valid input).
inline size_t Utf8Len(unsigned char c) { return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4; }

// True when `text` is well-formed UTF-8.
bool IsValidUtf8(std::string_view text);

// Replaces each invalid sequence (a bad lead byte together with the continuation bytes after it) with U+FFFD.
// Rust's from_utf8_lossy, which HF decoders use, gives one U+FFFD per stray continuation byte instead.
std::string Utf8Lossy(std::string_view s);

}  // namespace slide
