// Checkpoints saved in 4 bits by transformers + bitsandbytes (config.json's quantization_config with load_in_4bit):
// each linear layer's weight stored as bitsandbytes serialises a Params4bit (the packed codes, its absmax, the code
// book, the quant_state JSON, and with double quantisation the nested absmax and map). This engine reads those as the
// NF4 arrays it trains QLoRA over, as they are (nothing is requantised). A quantisation it does not read is refused
// naming the setting or the tensor.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/model/param_layout.h"
#include "engine/quant/tensor_nf4.h"

namespace slide {

struct Bnb4bitFormat {
  bool double_quant = false;  // bnb_4bit_use_double_quant
};

// Unset when config.json has no quantization_config. INVALID_ARGUMENT for one this engine does not read (8-bit,
// fp4, another method, a storage type other than uint8), naming the setting.
StatusOr<std::optional<Bnb4bitFormat>> ReadBnb4bitFormat(const std::string& model_dir);

// The tensors bitsandbytes writes beside the 4-bit weight `name`.
std::vector<std::string> Bnb4bitCompanionNames(const std::string& name, const Bnb4bitFormat& format);

// One weight from its tensors (`read(name)` gives a tensor of the checkpoint): the packed codes must hold `spec`'s
// elements, the quant_state name nf4 with blocks of 64 (256 for the nested absmax) and `spec`'s shape, and the code
// books must be NF4's and the signed dynamic map; each mismatch is INVALID_ARGUMENT naming the tensor.
// `metadata_only` reads and checks only the small tensors (quant_state, code books, the nested absmax), as submission
// does: the packed codes and the absmax are not read, and the result holds no arrays.
StatusOr<Nf4Tensors> ReadBnb4bitWeight(const ParamSpec& spec, const Bnb4bitFormat& format,
                                       const std::function<StatusOr<at::Tensor>(const std::string&)>& read,
                                       bool metadata_only = false);

}  // namespace slide
