#include "engine/model/hf_checkpoint.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/zeros.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/common/files.h"
#include "engine/model/safetensors.h"
#include "engine/quant/bnb_4bit.h"

namespace fs = std::filesystem;

namespace slide {
namespace {

using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// name -> (file, entry) across one or more safetensors files.
struct TensorSource {
  std::shared_ptr<SafetensorsFile> file;
  const SafetensorsEntry* entry = nullptr;
};

StatusOr<std::map<std::string, TensorSource>> OpenCheckpoint(const fs::path& dir) {
  std::map<std::string, TensorSource> sources;
  if (fs::exists(dir / kIndexFile)) {
    const std::string index_path = (dir / kIndexFile).string();
    SLIDE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir / kIndexFile));
    json index;
    try {
      index = json::parse(text);
    } catch (const json::exception& e) {  // a parse_error, or out_of_range: a number too large for a double
      return InvalidArgument(index_path + ": not valid JSON (" + e.what() + ")");
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return InvalidArgument(index_path + ": missing object 'weight_map'");
    std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it->is_string()) return InvalidArgument(index_path + ": weight_map['" + it.key() + "'] is not a file name");
      const std::string shard = it->get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..")
        return InvalidArgument(index_path + ": weight_map['" + it.key() + "'] names '" + shard +
                               "', which is not a file in the model directory");
      auto& file = files[shard];
      if (!file) {
        auto opened = SafetensorsFile::Open((dir / shard).string());
        if (!opened.ok()) return opened.status().WithContext(index_path + " names shard '" + shard + "'");
        file = opened.value();
      }
      const SafetensorsEntry* entry = file->Find(it.key());
      if (entry == nullptr)
        return InvalidArgument(index_path + ": tensor '" + it.key() + "' is mapped to " + file->path() +
                               ", which does not contain it");
      sources[it.key()] = {file, entry};
    }
    return sources;
  }
  if (!fs::exists(dir / kSingleFile)) {
    std::string hint =
        fs::exists(dir / "pytorch_model.bin") ? " (pytorch_model.bin is not supported: convert to safetensors)" : "";
    return NotFound(dir.string() + ": no " + kSingleFile + " or " + kIndexFile + hint);
  }
  SLIDE_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open((dir / kSingleFile).string()));
  for (const auto& e : file->entries()) sources[e.name] = {file, &e};
  return sources;
}

bool IgnorableExtra(const std::string& name, bool tied) {
  // Older checkpoints store RoPE's inverse frequencies; tied checkpoints may still store the LM head.
  if (name.size() > 22 && name.ends_with(".rotary_emb.inv_freq")) return true;
  return tied && name == "lm_head.weight";
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

at::Tensor ModelParams::Param(size_t unit, const std::string& local) const {
  const ParamSpec* spec = layout.units.at(unit).Find(local);
  TORCH_CHECK(spec != nullptr, "no parameter ", local, " in unit ", layout.units.at(unit).name);
  return ParamView(*spec, units.at(unit));
}

std::vector<std::pair<std::string, at::Tensor>> ModelParams::Named() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (const auto& p : layout.units[u].params) out.emplace_back(p.name, ParamView(p, units[u]));
  return out;
}

ModelParams ModelParams::To(at::TensorOptions options) const {
  ModelParams out{layout, {}};
  for (const auto& t : units) out.units.push_back(t.to(options, /*non_blocking=*/false, /*copy=*/true));
  return out;
}

ModelParams ZeroParams(const ModelLayout& layout, at::TensorOptions options) {
  ModelParams p{layout, {}};
  for (const auto& u : layout.units) p.units.push_back(at::zeros({u.numel}, options));
  return p;
}

bool AllFinite(const at::Tensor& t) {
  // In slices: one boolean mask of a 128K x 4096 embedding would be half a gigabyte.
  const at::Tensor flat = t.reshape({-1});
  constexpr int64_t kSlice = int64_t{1} << 22;
  for (int64_t at = 0; at < flat.numel(); at += kSlice)
    if (!at::isfinite(flat.slice(0, at, std::min(flat.numel(), at + kSlice))).all().item<bool>()) return false;
  return true;
}

namespace {

// Whether a decoder layer's projection is stored in 4 bits (bitsandbytes' packed codes: uint8, half its elements).
bool StoredIn4Bits(const ParamSpec& spec, const UnitLayout& unit, const SafetensorsEntry& e,
                   const std::optional<Bnb4bitFormat>& four_bit) {
  return four_bit && unit.kind == UnitKind::kDecoderLayer && spec.shape.size() == 2 && e.dtype == c10::kByte;
}

// Each parameter of `layout` with its source tensor: presence, dtype and shape checked, extras refused. In a 4-bit
// checkpoint a projection may be stored as bitsandbytes' packed codes, its companion tensors beside it.
StatusOr<std::vector<std::vector<const TensorSource*>>> MatchLayout(const std::map<std::string, TensorSource>& sources,
                                                                    const ModelLayout& layout, const ModelConfig& cfg,
                                                                    const std::string& model_dir,
                                                                    const std::optional<Bnb4bitFormat>& four_bit) {
  std::vector<std::vector<const TensorSource*>> matched(layout.units.size());
  std::vector<std::string> missing;
  std::set<std::string> used;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    for (const auto& spec : layout.units[u].params) {
      auto it = sources.find(spec.name);
      if (it == sources.end()) {
        missing.push_back(spec.name);
        matched[u].push_back(nullptr);
        continue;
      }
      const SafetensorsEntry& e = *it->second.entry;
      if (StoredIn4Bits(spec, layout.units[u], e, four_bit)) {
        int64_t numel = 1;
        for (int64_t d : e.shape) numel *= d;
        if (numel * 2 != spec.numel)
          return InvalidArgument(it->second.file->path() + ": tensor '" + spec.name + "' holds " +
                                 std::to_string(numel) + " bytes of 4-bit codes but config.json implies " +
                                 ShapeString(spec.shape) + " (" + std::to_string(spec.numel / 2) + " bytes)");
        for (const std::string& companion : Bnb4bitCompanionNames(spec.name, *four_bit)) {
          if (!sources.count(companion))
            return InvalidArgument(model_dir + ": checkpoint lacks tensor '" + companion +
                                   "' (bitsandbytes' 4-bit state of '" + spec.name + "')");
          used.insert(companion);
        }
        matched[u].push_back(&it->second);
        used.insert(spec.name);
        continue;
      }
      if (e.dtype != c10::kFloat && e.dtype != c10::kHalf && e.dtype != c10::kBFloat16)
        return InvalidArgument(it->second.file->path() + ": tensor '" + spec.name + "' has dtype " +
                               SafetensorsDtypeName(e.dtype) + "; expected F32, F16 or BF16");
      if (e.shape != spec.shape)
        return InvalidArgument(it->second.file->path() + ": tensor '" + spec.name + "' has shape " +
                               ShapeString(e.shape) + " but config.json implies " + ShapeString(spec.shape));
      matched[u].push_back(&it->second);
      used.insert(spec.name);
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += ", ...";
    return InvalidArgument(model_dir + ": checkpoint lacks " + std::to_string(missing.size()) +
                           " tensor(s) the config needs: " + list);
  }
  for (const auto& [name, src] : sources) {
    if (!used.count(name) && !IgnorableExtra(name, cfg.tie_word_embeddings))
      return InvalidArgument(src.file->path() + ": tensor '" + name + "' is not part of a " + cfg.model_type +
                             " model with this config.json");
  }
  return matched;
}

}  // namespace

Status CheckHfCheckpoint(const std::string& model_dir, const ModelConfig& cfg) {
  SLIDE_ASSIGN_OR_RETURN(const std::optional<Bnb4bitFormat> four_bit, ReadBnb4bitFormat(model_dir));
  SLIDE_ASSIGN_OR_RETURN(auto sources, OpenCheckpoint(fs::path(model_dir)));
  const ModelLayout layout = BuildModelLayout(cfg);
  SLIDE_ASSIGN_OR_RETURN(auto matched, MatchLayout(sources, layout, cfg, model_dir, four_bit));
  if (!four_bit) return Status::Ok();
  // A 4-bit checkpoint's small tensors (quant_state, code books, nested absmax) are read here, so that one this
  // engine does not read fails the submission, not the job; the codes themselves are read when the job runs.
  auto read = [&](const std::string& name) -> StatusOr<at::Tensor> {
    auto it = sources.find(name);
    if (it == sources.end()) return InvalidArgument(model_dir + ": checkpoint lacks tensor '" + name + "'");
    return it->second.file->Read(*it->second.entry);
  };
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (size_t p = 0; p < layout.units[u].params.size(); ++p) {
      const ParamSpec& spec = layout.units[u].params[p];
      const TensorSource& src = *matched[u][p];
      if (!StoredIn4Bits(spec, layout.units[u], *src.entry, four_bit)) continue;
      const auto checked = ReadBnb4bitWeight(spec, *four_bit, read, /*metadata_only=*/true);
      if (!checked.ok()) return checked.status().WithContext(src.file->path());
    }
  return Status::Ok();
}

Status LoadHfCheckpointUnits(const std::string& model_dir, const ModelConfig& cfg, c10::ScalarType dtype,
                             const std::function<Status(size_t unit, LoadedUnit&& loaded)>& on_unit,
                             const std::function<Status()>& interrupted) {
  const fs::path dir(model_dir);
  SLIDE_ASSIGN_OR_RETURN(const std::optional<Bnb4bitFormat> four_bit, ReadBnb4bitFormat(model_dir));
  SLIDE_ASSIGN_OR_RETURN(auto sources, OpenCheckpoint(dir));
  const ModelLayout layout = BuildModelLayout(cfg);
  SLIDE_ASSIGN_OR_RETURN(auto matched, MatchLayout(sources, layout, cfg, model_dir, four_bit));
  auto read = [&](const std::string& name) -> StatusOr<at::Tensor> {
    auto it = sources.find(name);
    if (it == sources.end()) return InvalidArgument(model_dir + ": checkpoint lacks tensor '" + name + "'");
    return it->second.file->Read(*it->second.entry);
  };
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    bool nf4 = false;
    for (size_t p = 0; p < unit.params.size(); ++p)
      nf4 = nf4 || StoredIn4Bits(unit.params[p], unit, *matched[u][p]->entry, four_bit);
    LoadedUnit loaded;
    std::optional<Nf4UnitBuilder> builder;
    if (nf4) {
      builder.emplace(unit, four_bit->double_quant, dtype,
                      [](int64_t n, c10::ScalarType t) { return at::empty({n}, at::TensorOptions().dtype(t)); });
    } else {
      loaded.flat = at::zeros({unit.numel}, at::TensorOptions().dtype(dtype));
    }
    for (size_t p = 0; p < unit.params.size(); ++p) {
      if (interrupted) SLIDE_RETURN_IF_ERROR(interrupted());
      const ParamSpec& spec = unit.params[p];
      const TensorSource& src = *matched[u][p];
      if (nf4 && StoredIn4Bits(spec, unit, *src.entry, four_bit)) {
        auto weight = ReadBnb4bitWeight(spec, *four_bit, read);
        if (!weight.ok()) return weight.status().WithContext(src.file->path());
        builder->SetQuantized(p, *weight);
        continue;
      }
      SLIDE_ASSIGN_OR_RETURN(at::Tensor value, src.file->Read(*src.entry));
      // A NaN or Inf weight makes every loss NaN: refuse the model here, naming the tensor, rather than train it.
      if (!AllFinite(value))
        return InvalidArgument(src.file->path() + ": tensor '" + spec.name + "' holds NaN or infinite values");
      if (!nf4) {
        ParamView(spec, loaded.flat).copy_(value);
      } else if (spec.shape.size() == 2) {  // a projection the checkpoint kept unquantised (llm_int8_skip_modules)
        builder->SetQuantized(p, QuantizeNf4Tensor(value.reshape({-1}), four_bit->double_quant));
      } else {
        builder->SetRest(p, value);
      }
    }
    if (nf4) loaded.nf4 = builder->Take();
    SLIDE_RETURN_IF_ERROR(on_unit(u, std::move(loaded)));
  }
  return Status::Ok();
}

StatusOr<ModelParams> LoadHfCheckpoint(const std::string& model_dir, const ModelConfig& cfg, c10::ScalarType dtype,
                                       const std::function<Status()>& interrupted) {
  ModelParams params;
  params.layout = BuildModelLayout(cfg);
  SLIDE_RETURN_IF_ERROR(LoadHfCheckpointUnits(
      model_dir, cfg, dtype,
      [&](size_t, LoadedUnit&& loaded) {
        if (loaded.nf4)
          return InvalidArgument(model_dir + " is saved in 4 bits (bitsandbytes): it trains with adapter: qlora");
        params.units.push_back(std::move(loaded.flat));
        return Status::Ok();
      },
      interrupted));
  return params;
}

Status ExportHfCheckpoint(const std::string& out_dir, const std::string& source_model_dir, const ModelParams& params,
                          const ExportOptions& options) {
  SLIDE_ASSIGN_OR_RETURN(OutputDirectory out, OutputDirectory::Open(out_dir, {}));
  return ExportHfCheckpoint(out, source_model_dir, params, options);
}

Status ExportHfCheckpoint(const OutputDirectory& out, const std::string& source_model_dir, const ModelParams& params,
                          const ExportOptions& options) {
  const fs::path src(source_model_dir);

  SLIDE_ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(src / "config.json"));
  json config;
  try {
    config = json::parse(config_text);
  } catch (const json::exception& e) {  // a parse_error, or out_of_range: a number too large for a double
    return InvalidArgument((src / "config.json").string() + ": not valid JSON (" + e.what() + ")");
  }
  const char* dtype_name = options.dtype == c10::kFloat  ? "float32"
                           : options.dtype == c10::kHalf ? "float16"
                                                         : "bfloat16";
  config["torch_dtype"] = dtype_name;
  // Written through a temporary renamed over it: a link planted in the output directory is replaced, never followed.
  SLIDE_RETURN_IF_ERROR(out.WriteFileAtomic("config.json", config.dump(2) + "\n"));

  // Group tensors into shards of at most max_shard_bytes (a tensor never splits).
  std::vector<NamedTensors> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (auto& [name, view] : params.Named()) {
    at::Tensor t = view.to(at::TensorOptions().dtype(options.dtype).device(at::kCPU));
    const int64_t bytes = t.numel() * t.element_size();
    if (shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  if (shards.size() == 1) {
    SLIDE_RETURN_IF_ERROR(WriteSafetensorsAt(out.fd(), kSingleFile, StreamedFrom(shards[0])));
  } else {
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      SLIDE_RETURN_IF_ERROR(WriteSafetensorsAt(out.fd(), name, StreamedFrom(shards[i])));
      for (const auto& [tensor, t] : shards[i]) weight_map[tensor] = name;
    }
    json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    SLIDE_RETURN_IF_ERROR(out.WriteFileAtomic(kIndexFile, index.dump(2) + "\n"));
  }

  for (const std::string& name : CompanionFilesCopiedOnExport()) {
    if (!fs::exists(src / name)) continue;
    // Read through the job's file confinement: a tokenizer file linked out of the roots is refused, not copied.
    SLIDE_ASSIGN_OR_RETURN(std::string content, ReadFileToString((src / name).string()));
    SLIDE_RETURN_IF_ERROR(out.WriteFileAtomic(name, content));
  }
  return Status::Ok();
}

const std::vector<std::string>& CompanionFilesCopiedOnExport() {
  static const std::vector<std::string> names = {"tokenizer.json",  "tokenizer_config.json",  "special_tokens_map.json",
                                                 "tokenizer.model", "generation_config.json", "vocab.json",
                                                 "merges.txt"};
  return names;
}

}  // namespace slide
