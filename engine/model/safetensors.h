// safetensors I/O: a validating reader that copies each tensor into memory it owns as it is read, and an atomic
// writer. Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, ...},
// then the data section; offsets are relative to the data section.
// The reader never maps the file: a file truncated or rewritten in place while it is read (`cp new old`) gives an
// error for that read, never a SIGBUS that would take the whole process down.
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
  // Reads and validates the whole header (not the data); every failure names the file (and the tensor).
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
  // The tensor's bytes, read into a new CPU tensor. DATA_LOSS when the file no longer holds them (truncated or
  // replaced since Open).
  StatusOr<at::Tensor> Read(const SafetensorsEntry& entry) const;

 private:
  SafetensorsFile() = default;
  // Header, entries, overlaps, for a file of `size` bytes whose header is `header` (without the length prefix).
  Status Parse(const uint8_t* header, uint64_t header_len, uint64_t size);
  std::string path_;
  int fd_ = -1;                          // Open: the file, read with pread
  const uint8_t* bytes_data_ = nullptr;  // FromBytes: the data section in the caller's memory
  uint64_t data_offset_ = 0;             // where the data section starts in the file
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
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
// The same for `name` inside the open directory `dir_fd` (see OutputDirectory, engine/common/files.h).
Status WriteSafetensorsAt(int dir_fd, const std::string& name, std::vector<StreamedTensor> tensors,
                          const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
// Tensors held in memory, as StreamedTensors (copied to CPU contiguous).
std::vector<StreamedTensor> StreamedFrom(const NamedTensors& tensors);

// "BF16" <-> kBFloat16 etc. Supported: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL.
StatusOr<c10::ScalarType> SafetensorsDtypeFromName(const std::string& name);
std::string SafetensorsDtypeName(c10::ScalarType dtype);

}  // namespace slide
