#include "engine/model/safetensors.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ext/stdio_filebuf.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Internal(path + ": fstat failed (" + std::strerror(errno) + ")");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return InvalidArgument(path + ": " + std::to_string(size) + " bytes is too short for a safetensors header");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Internal(path + ": mmap failed (" + std::strerror(errno) + ")");

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->self_ = file;
  file->path_ = path;
  file->map_ = map;
  file->map_size_ = size;
  SLIDE_RETURN_IF_ERROR(file->Parse(static_cast<const uint8_t*>(map), size));
  return file;
}

StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(const uint8_t* bytes, size_t size,
                                                                      const std::string& name) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->self_ = file;
  file->path_ = name;
  if (size < 8)
    return InvalidArgument(name + ": " + std::to_string(size) + " bytes is too short for a safetensors header");
  SLIDE_RETURN_IF_ERROR(file->Parse(bytes, size));
  return file;
}

Status SafetensorsFile::Parse(const uint8_t* bytes, uint64_t size) {
  const std::string& path = path_;
  SafetensorsFile* file = this;
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian on every supported host
  if (header_len > kMaxHeaderBytes)
    return InvalidArgument(path + ": header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  if (header_len > size - 8)
    return InvalidArgument(path + ": header length " + std::to_string(header_len) + " runs past the end of the " +
                           std::to_string(size) + "-byte file");
  const uint64_t data_size = size - 8 - header_len;
  file->data_ = bytes + 8 + header_len;

  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
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
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

at::Tensor SafetensorsFile::View(const SafetensorsEntry& entry) const {
  auto keep_alive = self_.lock();
  auto options = at::TensorOptions().dtype(entry.dtype).device(at::kCPU);
  if (entry.end == entry.begin) return at::empty(entry.shape, options);
  return at::from_blob(
      const_cast<uint8_t*>(data_ + entry.begin), entry.shape, [keep_alive](void*) mutable { keep_alive.reset(); },
      options);
}

Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<StreamedTensor> streamed;
  for (const auto& [name, t] : tensors) {
    at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
    streamed.push_back({name, cpu.scalar_type(), cpu.sizes().vec(), [cpu]() -> StatusOr<at::Tensor> { return cpu; }});
  }
  return WriteSafetensorsStreamed(path, std::move(streamed), metadata);
}

Status WriteSafetensorsStreamed(const std::string& path, std::vector<StreamedTensor> tensors,
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
  ::unlink(tmp.c_str());  // a stale temporary, or a link planted there, is never written through
  {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return InvalidArgument(tmp + ": cannot create (" + std::strerror(errno) + ")");
    __gnu_cxx::stdio_filebuf<char> file(fd, std::ios::out | std::ios::binary);  // closes the fd
    std::ostream out(&file);
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (size_t i = 0; i < tensors.size() && out; ++i) {
      StatusOr<at::Tensor> produced = tensors[i].produce();
      if (!produced.ok()) {
        ::unlink(tmp.c_str());
        return produced.status().WithContext(path + ": tensor '" + tensors[i].name + "'");
      }
      const at::Tensor t = produced->contiguous();
      if (t.scalar_type() != tensors[i].dtype || static_cast<uint64_t>(t.nbytes()) != sizes[i] || !t.is_cpu())
        return Internal(path + ": tensor '" + tensors[i].name + "' was produced with another dtype or size");
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(sizes[i]));
    }
    out.flush();
    if (!out) {
      const int err = errno;
      ::unlink(tmp.c_str());
      return Internal(tmp + ": write failed (" + std::strerror(err) + ")");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal(path + ": rename failed (" + ec.message() + ")");
  return Status::Ok();
}

}  // namespace slide
