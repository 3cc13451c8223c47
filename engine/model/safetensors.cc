#include "engine/model/safetensors.h"

#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ext/stdio_filebuf.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/common/files.h"
#include "engine/common/path_confinement.h"

namespace slide {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // same limit as the reference implementation

const std::vector<std::pair<std::string, c10::ScalarType>>& DtypeTable() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> table = {
      {"F32", c10::kFloat}, {"F16", c10::kHalf},  {"BF16", c10::kBFloat16}, {"F64", c10::kDouble}, {"I64", c10::kLong},
      {"I32", c10::kInt},   {"I16", c10::kShort}, {"I8", c10::kChar},       {"U8", c10::kByte},    {"BOOL", c10::kBool},
  };
  return table;
}

Status ParseEntry(const std::string& file, const std::string& name, const json& v, uint64_t data_size,
                  SafetensorsEntry& out) {
  auto bad = [&](const std::string& what) { return InvalidArgument(file + ": tensor '" + name + "': " + what); };
  if (!v.is_object()) return bad("header entry is not an object");
  if (!v.contains("dtype") || !v["dtype"].is_string()) return bad("missing string field 'dtype'");
  auto dtype = SafetensorsDtypeFromName(v["dtype"].get<std::string>());
  if (!dtype.ok()) return bad(dtype.status().message());
  out.dtype = dtype.value();
  if (!v.contains("shape") || !v["shape"].is_array()) return bad("missing array field 'shape'");
  uint64_t numel = 1;
  for (const json& d : v["shape"]) {
    if (!d.is_number_unsigned()) return bad("shape " + v["shape"].dump() + " has a non-natural dimension");
    uint64_t x = d.get<uint64_t>();
    if (x != 0 && numel > (1ull << 62) / x) return bad("shape " + v["shape"].dump() + " overflows");
    numel *= x;
    out.shape.push_back(static_cast<int64_t>(x));
  }
  const json& offs = v.contains("data_offsets") ? v["data_offsets"] : json();
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
    return bad("'data_offsets' must be [begin, end]");
  out.begin = offs[0].get<uint64_t>();
  out.end = offs[1].get<uint64_t>();
  if (out.begin > out.end) return bad("data_offsets " + offs.dump() + " end before begin");
  if (out.end > data_size)
    return bad("data_offsets " + offs.dump() + " run past the data section (" + std::to_string(data_size) + " bytes)");
  const uint64_t expected = numel * c10::elementSize(out.dtype);
  if (out.end - out.begin != expected)
    return bad("data_offsets " + offs.dump() + " hold " + std::to_string(out.end - out.begin) +
               " bytes but dtype and shape need " + std::to_string(expected));
  out.name = name;
  return Status::Ok();
}

}  // namespace

StatusOr<c10::ScalarType> SafetensorsDtypeFromName(const std::string& name) {
  for (const auto& [n, t] : DtypeTable())
    if (n == name) return t;
  return InvalidArgument("unknown dtype '" + name + "'");
}

std::string SafetensorsDtypeName(c10::ScalarType dtype) {
  for (const auto& [n, t] : DtypeTable())
    if (t == dtype) return n;
  return "";
}

StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  SLIDE_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->fd_ = fd;  // closed by the destructor from here on
  file->path_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Internal(path + ": fstat failed (" + std::strerror(errno) + ")");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8)
    return InvalidArgument(path + ": " + std::to_string(size) + " bytes is too short for a safetensors header");
  uint64_t header_len = 0;
  if (::pread(fd, &header_len, 8, 0) != 8) return DataLoss(path + ": cannot read the header length");
  if (header_len > kMaxHeaderBytes)
    return InvalidArgument(path + ": header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  if (header_len > size - 8)
    return InvalidArgument(path + ": header length " + std::to_string(header_len) + " runs past the end of the " +
                           std::to_string(size) + "-byte file");
  std::vector<uint8_t> header(header_len);
  for (uint64_t done = 0; done < header_len;) {
    const ssize_t n = ::pread(fd, header.data() + done, header_len - done, static_cast<off_t>(8 + done));
    if (n <= 0) return DataLoss(path + ": the header ends early (the file changed while it was read)");
    done += static_cast<uint64_t>(n);
  }
  file->data_offset_ = 8 + header_len;
  SLIDE_RETURN_IF_ERROR(file->Parse(header.data(), header_len, size));
  return file;
}

StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(const uint8_t* bytes, size_t size,
                                                                      const std::string& name) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = name;
  if (size < 8)
    return InvalidArgument(name + ": " + std::to_string(size) + " bytes is too short for a safetensors header");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian on every supported host
  if (header_len > kMaxHeaderBytes)
    return InvalidArgument(name + ": header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  if (header_len > size - 8)
    return InvalidArgument(name + ": header length " + std::to_string(header_len) + " runs past the end of the " +
                           std::to_string(size) + "-byte file");
  file->data_offset_ = 8 + header_len;
  file->bytes_data_ = bytes + 8 + header_len;
  SLIDE_RETURN_IF_ERROR(file->Parse(bytes + 8, header_len, size));
  return file;
}

Status SafetensorsFile::Parse(const uint8_t* header_bytes, uint64_t header_len, uint64_t size) {
  const std::string& path = path_;
  SafetensorsFile* file = this;
  const uint64_t data_size = size - 8 - header_len;

  json header;
  try {
    header = json::parse(header_bytes, header_bytes + header_len);
  } catch (const json::exception& e) {  // a parse_error, or out_of_range: a number too large for a double
    return InvalidArgument(path + ": header is not valid JSON (" + e.what() + ")");
  }
  if (!header.is_object()) return InvalidArgument(path + ": header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return InvalidArgument(path + ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return InvalidArgument(path + ": __metadata__ value '" + m.key() + "' is not a string");
        file->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry;
    SLIDE_RETURN_IF_ERROR(ParseEntry(path, it.key(), *it, data_size, entry));
    file->index_[entry.name] = file->entries_.size();
    file->entries_.push_back(std::move(entry));
  }

  // No two tensors may share bytes.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : file->entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    const auto* cur = by_offset[i];
    if (cur->begin < prev->end && cur->end > cur->begin)
      return InvalidArgument(path + ": tensors '" + prev->name + "' and '" + cur->name +
                             "' overlap in the data section");
  }
  return Status::Ok();
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

StatusOr<at::Tensor> SafetensorsFile::Read(const SafetensorsEntry& entry) const {
  at::Tensor out = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype).device(at::kCPU));
  const uint64_t bytes = entry.end - entry.begin;
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  if (bytes_data_ != nullptr) {
    if (bytes > 0) std::memcpy(dst, bytes_data_ + entry.begin, bytes);
    return out;
  }
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t chunk = std::min<uint64_t>(bytes - done, uint64_t{1} << 30);
    const ssize_t n = ::pread(fd_, dst + done, chunk, static_cast<off_t>(data_offset_ + entry.begin + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return DataLoss(path_ + ": tensor '" + entry.name + "': the file ends before its bytes (truncated or replaced " +
                      "while it was being read)" + (n < 0 ? std::string(": ") + std::strerror(errno) : ""));
    done += static_cast<uint64_t>(n);
  }
  return out;
}

std::vector<StreamedTensor> StreamedFrom(const NamedTensors& tensors) {
  std::vector<StreamedTensor> streamed;
  for (const auto& [name, t] : tensors) {
    at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
    streamed.push_back({name, cpu.scalar_type(), cpu.sizes().vec(), [cpu]() -> StatusOr<at::Tensor> { return cpu; }});
  }
  return streamed;
}

Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                        const std::map<std::string, std::string>& metadata) {
  return WriteSafetensorsAt(AT_FDCWD, path, StreamedFrom(tensors), metadata);
}

Status WriteSafetensorsStreamed(const std::string& path, std::vector<StreamedTensor> tensors,
                                const std::map<std::string, std::string>& metadata) {
  return WriteSafetensorsAt(AT_FDCWD, path, std::move(tensors), metadata);
}

Status WriteSafetensorsAt(int dir_fd, const std::string& path, std::vector<StreamedTensor> tensors,
                          const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const StreamedTensor& t = tensors[i];
    if (i > 0 && tensors[i - 1].name == t.name) return InvalidArgument(path + ": tensor '" + t.name + "' given twice");
    std::string dtype = SafetensorsDtypeName(t.dtype);
    if (dtype.empty()) return InvalidArgument(path + ": tensor '" + t.name + "' has an unsupported dtype");
    uint64_t bytes = c10::elementSize(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned

  const std::string tmp = path + ".tmp";
  ::unlinkat(dir_fd, tmp.c_str(), 0);  // a stale temporary, or a link planted there, is never written through
  {
    const int fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return InvalidArgument(tmp + ": cannot create (" + std::strerror(errno) + ")");
    __gnu_cxx::stdio_filebuf<char> file(fd, std::ios::out | std::ios::binary);  // closes the fd
    std::ostream out(&file);
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (size_t i = 0; i < tensors.size() && out; ++i) {
      StatusOr<at::Tensor> produced = tensors[i].produce();
      if (!produced.ok()) {
        ::unlinkat(dir_fd, tmp.c_str(), 0);
        return produced.status().WithContext(path + ": tensor '" + tensors[i].name + "'");
      }
      const at::Tensor t = produced->contiguous();
      if (t.scalar_type() != tensors[i].dtype || static_cast<uint64_t>(t.nbytes()) != sizes[i] || !t.is_cpu())
        return Internal(path + ": tensor '" + tensors[i].name + "' was produced with another dtype or size");
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(sizes[i]));
    }
    out.flush();
    if (!out || ::fsync(fd) != 0) {
      const int err = errno;
      ::unlinkat(dir_fd, tmp.c_str(), 0);
      return Status(StatusCode::kFailedPrecondition, tmp + ": write failed (" + std::strerror(err) + ")");
    }
  }
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, path.c_str()) != 0)
    return Status(StatusCode::kFailedPrecondition, path + ": rename failed (" + std::strerror(errno) + ")");
  return SyncDirectoryOf(dir_fd, path);
}

}  // namespace slide
