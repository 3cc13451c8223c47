#include "engine/quant/bnb_4bit.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "engine/data/json_file.h"
#include "engine/optim/adamw_8bit.h"
#include "engine/quant/nf4.h"

namespace slide {
namespace {

using nlohmann::json;

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A float table stored beside a weight equals ours exactly.
template <size_t N>
Status SameTable(const at::Tensor& t, const std::array<float, N>& want, const std::string& name, const char* what) {
  if (t.scalar_type() != at::kFloat || t.numel() != static_cast<int64_t>(N))
    return InvalidArgument("tensor '" + name + "' must be " + std::to_string(N) + " float32 values (" + what + ")");
  const at::Tensor c = t.contiguous();
  const float* v = c.data_ptr<float>();
  for (size_t i = 0; i < N; ++i)
    if (v[i] != want[i])
      return InvalidArgument("tensor '" + name + "' is not " + what + " (value " + std::to_string(i) + " is " +
                             std::to_string(v[i]) + ", not " + std::to_string(want[i]) + ")");
  return Status::Ok();
}

}  // namespace

StatusOr<std::optional<Bnb4bitFormat>> ReadBnb4bitFormat(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  SLIDE_ASSIGN_OR_RETURN(json config, ReadOptionalJsonObject(path));
  if (config.is_null() || !config.contains("quantization_config") || config["quantization_config"].is_null())
    return std::optional<Bnb4bitFormat>();
  const json& q = config["quantization_config"];
  auto refuse = [&](const std::string& why) {
    return InvalidArgument(path + ": quantization_config " + why +
                           "; this engine reads bitsandbytes' 4-bit NF4 checkpoints (or unquantised ones)");
  };
  if (!q.is_object()) return refuse("is not an object");
  const std::string method = q.value("quant_method", "");
  if (method != "bitsandbytes") return refuse("has quant_method '" + method + "'");
  if (q.value("load_in_8bit", false)) return refuse("is 8-bit (load_in_8bit)");
  if (!q.value("load_in_4bit", false)) return refuse("has no load_in_4bit");
  const std::string type = q.value("bnb_4bit_quant_type", "fp4");
  if (type != "nf4") return refuse("has bnb_4bit_quant_type '" + type + "'");
  const std::string storage = q.value("bnb_4bit_quant_storage", "uint8");
  if (storage != "uint8") return refuse("has bnb_4bit_quant_storage '" + storage + "'");
  return std::optional<Bnb4bitFormat>(Bnb4bitFormat{.double_quant = q.value("bnb_4bit_use_double_quant", false)});
}

std::vector<std::string> Bnb4bitCompanionNames(const std::string& name, const Bnb4bitFormat& format) {
  std::vector<std::string> names = {name + ".absmax", name + ".quant_map", name + ".quant_state.bitsandbytes__nf4"};
  if (format.double_quant) {
    names.push_back(name + ".nested_absmax");
    names.push_back(name + ".nested_quant_map");
  }
  return names;
}

StatusOr<Nf4Tensors> ReadBnb4bitWeight(const ParamSpec& spec, const Bnb4bitFormat& format,
                                       const std::function<StatusOr<at::Tensor>(const std::string&)>& read,
                                       bool metadata_only) {
  const std::string& name = spec.name;
  SLIDE_RETURN_IF_ERROR(CheckNf4Numel(spec.numel, "tensor '" + name + "'"));
  const int64_t blocks = spec.numel / kNf4Block, stats = (blocks + kNf4StatsBlock - 1) / kNf4StatsBlock;

  // The quant_state: a JSON text stored as bytes.
  const std::string state_name = name + ".quant_state.bitsandbytes__nf4";
  SLIDE_ASSIGN_OR_RETURN(at::Tensor state_bytes, read(state_name));
  if (state_bytes.scalar_type() != at::kByte)
    return InvalidArgument("tensor '" + state_name + "' must be uint8 (a JSON text)");
  const at::Tensor sb = state_bytes.contiguous();
  const std::string text(reinterpret_cast<const char*>(sb.data_ptr<uint8_t>()), static_cast<size_t>(sb.numel()));
  json state;
  try {
    state = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgument("tensor '" + state_name + "' is not a JSON object (" + e.what() + ")");
  }
  if (!state.is_object()) return InvalidArgument("tensor '" + state_name + "' is not a JSON object");
  auto bad_state = [&](const std::string& why) { return InvalidArgument("tensor '" + state_name + "' " + why); };
  if (state.value("quant_type", "") != "nf4")
    return bad_state("has quant_type '" + state.value("quant_type", "") + "'; only nf4 is read");
  if (!state.contains("blocksize") || !state["blocksize"].is_number_integer() || state["blocksize"] != kNf4Block)
    return bad_state("must have blocksize 64");
  std::vector<int64_t> shape;
  if (state.contains("shape") && state["shape"].is_array())
    for (const auto& d : state["shape"])
      if (d.is_number_integer()) shape.push_back(d.get<int64_t>());
  if (shape != spec.shape)
    return bad_state("has shape " + ShapeString(shape) + " but config.json implies " + ShapeString(spec.shape));
  if (format.double_quant != state.contains("nested_offset"))
    return bad_state(format.double_quant ? "lacks nested_offset (the config asks for double quantisation)"
                                         : "has nested_offset, but the config does not ask for double quantisation");

  Nf4Tensors w;
  w.numel = spec.numel;
  SLIDE_ASSIGN_OR_RETURN(at::Tensor code, read(name + ".quant_map"));
  SLIDE_RETURN_IF_ERROR(SameTable(code, Nf4CodeBook(), name + ".quant_map", "the NF4 code book"));
  at::Tensor absmax;
  if (!metadata_only) {
    SLIDE_ASSIGN_OR_RETURN(w.packed, read(name));
    if (w.packed.scalar_type() != at::kByte || w.packed.numel() != spec.numel / 2)
      return InvalidArgument("tensor '" + name + "' must hold " + std::to_string(spec.numel / 2) +
                             " uint8 values (two 4-bit codes each)");
    w.packed = w.packed.reshape({-1}).contiguous();
    SLIDE_ASSIGN_OR_RETURN(absmax, read(name + ".absmax"));
    absmax = absmax.reshape({-1}).contiguous();
    const bool plain = !format.double_quant;
    if (absmax.scalar_type() != (plain ? at::kFloat : at::kByte) || absmax.numel() != blocks)
      return InvalidArgument("tensor '" + name + ".absmax' must hold " + std::to_string(blocks) +
                             (plain ? " float32 values" : " uint8 codes (double quantisation)"));
  }
  if (!format.double_quant) {
    w.absmax = absmax;
    return w;
  }
  if (!state.contains("nested_blocksize") || state["nested_blocksize"] != kNf4StatsBlock)
    return bad_state("must have nested_blocksize 256");
  if (!state["nested_offset"].is_number()) return bad_state("has a nested_offset that is not a number");
  SLIDE_ASSIGN_OR_RETURN(at::Tensor nested_map, read(name + ".nested_quant_map"));
  SLIDE_RETURN_IF_ERROR(
      SameTable(nested_map, SignedDynamicMap(), name + ".nested_quant_map", "the signed dynamic map"));
  SLIDE_ASSIGN_OR_RETURN(at::Tensor absmax2, read(name + ".nested_absmax"));
  if (absmax2.scalar_type() != at::kFloat || absmax2.numel() != stats)
    return InvalidArgument("tensor '" + name + ".nested_absmax' must hold " + std::to_string(stats) +
                           " float32 values");
  w.stats_codes = absmax;
  w.absmax2 = absmax2.reshape({-1}).contiguous();
  // bitsandbytes keeps the offset as a float32 tensor and writes it to JSON as a double: the float it was.
  w.offset = static_cast<float>(state["nested_offset"].get<double>());
  return w;
}

}  // namespace slide
