// The demo's byte-level BPE on arbitrary text (what a dataset line can hold): invalid UTF-8 is refused, valid text
// encodes to ids inside the vocabulary and decodes back to itself.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/common/utf8.h"
#include "engine/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<slide::Tokenizer> tok =
      std::move(slide::Tokenizer::FromFile(std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/model/tokenizer.json"))
          .value();
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto ids = tok->Encode(text);
  if (!ids.ok()) return 0;
  for (int32_t id : *ids)
    if (id < 0 || id >= tok->vocab_size()) std::abort();
  if (tok->Decode(*ids) != text) std::abort();
  return 0;
}
