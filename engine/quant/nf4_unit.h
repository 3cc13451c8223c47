// A decoder layer of a frozen base in NF4 (QLoRA): every linear projection (each 2-D parameter) quantised on its own,
// as bitsandbytes quantises each Linear4bit, and the rest (norms, biases) kept in the compute dtype. One allocation
// per class of array (packed codes, block scales, second-level scales, the rest), each parameter a range of them, so
// a layer moves to the device in four copies and dequantises into its flat slot with one kernel per projection.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/model/param_layout.h"
#include "engine/quant/tensor_nf4.h"

namespace slide {

struct Nf4UnitEntry {
  bool quantized = false;
  int64_t packed_at = 0;  // bytes into packed
  int64_t blocks_at = 0;  // entries into absmax / stats_codes
  int64_t stats_at = 0;   // entries into absmax2
  float offset = 0;       // double quantisation's offset of this parameter
  int64_t rest_at = 0;    // elements into rest
};

struct Nf4Unit {
  int64_t numel = 0;  // the unit's flat length: the slot it dequantises into
  bool double_quant = false;
  std::vector<Nf4UnitEntry> entries;  // one per parameter, in layout order
  at::Tensor packed;                  // uint8 [sum numel / 2]
  at::Tensor absmax;                  // fp32 [sum numel / 64]   (plain scales)
  at::Tensor stats_codes;             // uint8 [sum numel / 64]  (double quantised scales)
  at::Tensor absmax2;                 // fp32 [sum ceil(numel / 16384)]
  at::Tensor rest;                    // compute dtype [sum numel of the unquantised parameters]

  // The arrays (their bytes: what the host holds and the link carries for the layer).
  std::vector<at::Tensor*> Arrays();
  std::vector<const at::Tensor*> Arrays() const;
  int64_t bytes() const;
};

// Host memory for the arrays (page-locked where they will be copied to the device).
using HostAllocator = std::function<at::Tensor(int64_t numel, c10::ScalarType dtype)>;

// Assembles a layer's arrays parameter by parameter: each 2-D parameter from its NF4 encoding (quantised here, or as
// read from a 4-bit checkpoint), the rest from its values. Every parameter must be set before Take.
class Nf4UnitBuilder {
 public:
  Nf4UnitBuilder(const UnitLayout& layout, bool double_quant, c10::ScalarType rest_dtype, const HostAllocator& alloc);
  void SetQuantized(size_t param, const Nf4Tensors& weight);  // its numel the parameter's, the unit's scales
  void SetRest(size_t param, const at::Tensor& value);        // a 1-D parameter's values, any float dtype
  Nf4Unit Take();

 private:
  const UnitLayout& layout_;
  Nf4Unit unit_;
  std::vector<bool> set_;
};

// Quantises a layer: `flat` holds its weights in `layout` (any float dtype, host); `rest_dtype` is the compute dtype.
Nf4Unit QuantizeNf4Unit(const UnitLayout& layout, const at::Tensor& flat, bool double_quant, c10::ScalarType rest_dtype,
                        const HostAllocator& alloc);

// The same arrays' shape on another device or buffer: views of `storage`'s arrays sized as `unit`'s (the device
// scratch a load copies into). `storage` must be at least as large in each array.
Nf4Unit Nf4UnitViews(const Nf4Unit& unit, const Nf4Unit& storage);

// Writes the layer's weights into `dst` (flat [layout.numel], bf16 or fp32, on the arrays' device; padding between
// parameters is left as it was). On CUDA the kernels run on the current stream.
void DequantizeNf4Unit(const UnitLayout& layout, const Nf4Unit& unit, const at::Tensor& dst);

// The host bytes of a layer with this layout in NF4 (packed codes, scales, the rest in a `rest_bytes`-byte dtype):
// what the planner counts.
int64_t Nf4UnitBytes(const UnitLayout& layout, bool double_quant, int64_t rest_bytes);

}  // namespace slide
