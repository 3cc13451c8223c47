// safetensors header validation over arbitrary bytes: every input is accepted with consistent entries or refused
// with a status; no crash, no read outside the buffer.
#include <cstdint>
#include <cstdlib>

#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = slide::SafetensorsFile::FromBytes(data, size, "fuzz.safetensors");
  if (!file.ok()) return 0;
  const uint64_t data_bytes = size - 8;  // an upper bound on the data section
  for (const auto& e : (*file)->entries()) {
    if (e.begin > e.end || e.end > data_bytes || (*file)->Find(e.name) != &e) std::abort();
  }
  return 0;
}
