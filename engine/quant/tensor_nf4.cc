#include "engine/quant/tensor_nf4.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <vector>

#include "engine/optim/adamw_8bit.h"
#include "engine/quant/nf4.h"

#if SLIDE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/cuda_launchers.h"
#endif

namespace slide {
namespace {

int64_t Blocks(int64_t numel) { return numel / kNf4Block; }
int64_t StatsBlocks(int64_t numel) { return (Blocks(numel) + kNf4StatsBlock - 1) / kNf4StatsBlock; }

void CheckLayout(const Nf4Tensors& w) {
  TORCH_CHECK(w.numel > 0 && w.numel % kNf4Block == 0, "NF4: ", w.numel, " elements is not a multiple of 64");
  auto check = [&](const at::Tensor& t, at::ScalarType dtype, int64_t numel, const char* name) {
    TORCH_CHECK(t.defined() && t.scalar_type() == dtype && t.numel() == numel && t.is_contiguous() &&
                    t.device() == w.packed.device(),
                "NF4: ", name, " must be contiguous ", c10::toString(dtype), " [", numel,
                "] on the packed codes' device");
  };
  check(w.packed, at::kByte, w.numel / 2, "packed");
  if (w.double_quant()) {
    check(w.stats_codes, at::kByte, Blocks(w.numel), "stats_codes");
    check(w.absmax2, at::kFloat, StatsBlocks(w.numel), "absmax2");
  } else {
    check(w.absmax, at::kFloat, Blocks(w.numel), "absmax");
  }
}

#if SLIDE_HAVE_CUDA
// The NF4 values and the signed dynamic map on each device, uploaded once.
struct DeviceTables {
  at::Tensor nf4_code, stats_map;
};
const DeviceTables& TablesOn(const c10::Device& device) {
  static std::mutex mu;
  static std::map<int, DeviceTables> tables;
  std::lock_guard<std::mutex> lock(mu);
  auto it = tables.find(device.index());
  if (it != tables.end()) return it->second;
  auto upload = [&](const float* data, int64_t n) {
    return at::from_blob(const_cast<float*>(data), {n}, at::kFloat).to(device);
  };
  DeviceTables t{upload(Nf4CodeBook().data(), 16), upload(SignedDynamicMap().data(), 256)};
  return tables.emplace(device.index(), std::move(t)).first->second;
}
#endif

}  // namespace

int64_t Nf4Tensors::bytes() const {
  int64_t b = packed.defined() ? packed.nbytes() : 0;
  for (const at::Tensor* t : {&absmax, &stats_codes, &absmax2})
    if (t->defined()) b += t->nbytes();
  return b;
}

Nf4Tensors Nf4Tensors::To(const c10::Device& device, bool non_blocking) const {
  Nf4Tensors out = *this;
  for (at::Tensor* t : {&out.packed, &out.absmax, &out.stats_codes, &out.absmax2})
    if (t->defined()) *t = t->to(device, non_blocking);
  return out;
}

Nf4Tensors QuantizeNf4Tensor(const at::Tensor& x, bool double_quant) {
  TORCH_CHECK(x.is_cpu(), "QuantizeNf4Tensor: the weight must be in host memory");
  const at::Tensor f = x.to(at::kFloat).contiguous();
  Nf4Tensors w;
  w.numel = f.numel();
  TORCH_CHECK(w.numel > 0 && w.numel % kNf4Block == 0, "QuantizeNf4Tensor: ", w.numel,
              " elements is not a multiple of 64");
  w.packed = at::empty({w.numel / 2}, at::kByte);
  at::Tensor absmax = at::empty({Blocks(w.numel)}, at::kFloat);
  QuantizeNf4(f.data_ptr<float>(), w.numel, w.packed.data_ptr<uint8_t>(), absmax.data_ptr<float>());
  if (!double_quant) {
    w.absmax = absmax;
    return w;
  }
  w.offset = Nf4StatsOffset(absmax.data_ptr<float>(), Blocks(w.numel));
  w.stats_codes = at::empty({Blocks(w.numel)}, at::kByte);
  w.absmax2 = at::empty({StatsBlocks(w.numel)}, at::kFloat);
  CompressNf4Stats(absmax.data_ptr<float>(), Blocks(w.numel), w.offset, w.stats_codes.data_ptr<uint8_t>(),
                   w.absmax2.data_ptr<float>());
  return w;
}

void DequantizeNf4Into(const Nf4Tensors& w, const at::Tensor& out) {
  CheckLayout(w);
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  TORCH_CHECK((bf16 || out.scalar_type() == at::kFloat) && out.is_contiguous() && out.numel() == w.numel &&
                  out.device() == w.packed.device(),
              "DequantizeNf4Into: the output must be contiguous bf16 or fp32 [", w.numel, "] on the weight's device");
  if (w.packed.is_cpu()) {
    const uint8_t* packed = w.packed.data_ptr<uint8_t>();
    std::vector<float> expanded;
    const float* absmax = w.double_quant() ? nullptr : w.absmax.data_ptr<float>();
    if (w.double_quant()) {
      expanded.resize(static_cast<size_t>(Blocks(w.numel)));
      ExpandNf4Stats(w.stats_codes.data_ptr<uint8_t>(), w.absmax2.data_ptr<float>(), w.offset, Blocks(w.numel),
                     expanded.data());
      absmax = expanded.data();
    }
    if (bf16) return DequantizeNf4(packed, absmax, w.numel, reinterpret_cast<c10::BFloat16*>(out.data_ptr()));
    return DequantizeNf4(packed, absmax, w.numel, out.data_ptr<float>());
  }
#if SLIDE_HAVE_CUDA
  TORCH_CHECK(w.packed.is_cuda(), "DequantizeNf4Into: tensors on ", w.packed.device(), " are not supported");
  c10::cuda::CUDAGuard guard(w.packed.device());
  const DeviceTables& tables = TablesOn(w.packed.device());
  const cudaError_t err = cuda::DequantizeNf4(
      w.packed.data_ptr<uint8_t>(), w.double_quant() ? nullptr : w.absmax.data_ptr<float>(),
      w.double_quant() ? w.stats_codes.data_ptr<uint8_t>() : nullptr,
      w.double_quant() ? w.absmax2.data_ptr<float>() : nullptr, w.offset, tables.nf4_code.data_ptr<float>(),
      tables.stats_map.data_ptr<float>(), bf16 ? cuda::DType::kBFloat16 : cuda::DType::kFloat, out.data_ptr(), w.numel,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "NF4 dequantisation kernel: ", cudaGetErrorString(err));
#else
  TORCH_CHECK(false, "DequantizeNf4Into: tensors on ", w.packed.device(), " need a CUDA build");
#endif
}

}  // namespace slide
