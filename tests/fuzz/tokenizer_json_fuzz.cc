// tokenizer.json loading over arbitrary text; a tokenizer that loads encodes and decodes a fixed sentence.
#include <cstdint>
#include <string>

#include "engine/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tok = slide::Tokenizer::FromJson(std::string(reinterpret_cast<const char*>(data), size), "fuzz/tokenizer.json");
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello, world! 12 + 30 = 42. ", /*add_special_tokens=*/true);
  if (ids.ok()) (void)(*tok)->Decode(*ids);
  return 0;
}
