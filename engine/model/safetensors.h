// safetensors I/O: a validating, memory-mapped reader and an atomic writer.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, ...},
// then the data section; offsets are relative to the data section.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/common/status.h"

namespace slide {

struct SafetensorsEntry {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates the whole header; every failure names the file (and the tensor).
  static StatusOr<std::shared_ptr<SafetensorsFile>> Open(const std::string& path);
  // The same validation over `size` bytes in memory that outlive the result (`name` names it in errors).
  static StatusOr<std::shared_ptr<SafetensorsFile>> FromBytes(const uint8_t* bytes, size_t size,
                                                              const std::string& name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  // A read-only CPU tensor over the mapped bytes; it keeps the mapping alive. Clone before writing.
  at::Tensor View(const SafetensorsEntry& entry) const;

 private:
  SafetensorsFile() = default;
  Status Parse(const uint8_t* bytes, uint64_t size);  // header, entries, overlaps; data_ points into `bytes`
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes tensors (any device; copied to CPU contiguous) to `path` through a temporary file + rename.
Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// A tensor written without holding every other one in memory: `produce` is called once, in name order, when
// its bytes are due, and must return a CPU tensor of `dtype` and `shape` (e.g. read back from the NVMe tier).
struct StreamedTensor {
  std::string name;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> shape;
  std::function<StatusOr<at::Tensor>()> produce;
};
Status WriteSafetensorsStreamed(const std::string& path, std::vector<StreamedTensor> tensors,
                                const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// "BF16" <-> kBFloat16 etc. Supported: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL.
StatusOr<c10::ScalarType> SafetensorsDtypeFromName(const std::string& name);
std::string SafetensorsDtypeName(c10::ScalarType dtype);

}  // namespace slide
