// NF4 (engine/quant) against bitsandbytes on fixtures its CPU backend produced (scripts/make_nf4_fixtures.py):
// the code book exactly; the quantisation's packed codes and absmax byte for byte; the dequantisation to bf16 bit for
// bit, with plain and with double-quantised scales; the double quantisation's second-level absmax exactly and its
// 8-bit codes equal or nearer (bitsandbytes' CPU blockwise quantiser rounds through a 65,536-bin lookup table rather
// than taking the nearest code, as adamw_8bit_test.cc explains); and the CUDA kernel bit for bit against the CPU.
#include "engine/quant/nf4.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/optim/adamw_8bit.h"
#include "engine/quant/tensor_nf4.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

// bitsandbytes' fixture.
class Bnb : public testing::FixtureTensors {
 public:
  Bnb() : FixtureTensors("quant/nf4.safetensors") {}
};

// bf16 [rows, cols] small: 32 blocks; wide: cols 160, blocks straddle rows; many: 1,280 blocks (five statistics
// blocks); edge: a zero block and an outlier. ties: fp32, values on and beside the midpoints between codes.
const std::vector<std::string> kWeights = {"small", "wide", "many", "edge", "ties"};

std::vector<uint16_t> Bits(const at::Tensor& bf16) {
  std::vector<uint16_t> bits(static_cast<size_t>(bf16.numel()));
  std::memcpy(bits.data(), bf16.data_ptr(), bits.size() * sizeof(uint16_t));
  return bits;
}

std::vector<uint16_t> Bits(const std::vector<c10::BFloat16>& v) {
  std::vector<uint16_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), bits.size() * sizeof(uint16_t));
  return bits;
}

TEST(Nf4, CodeBookIsBitsandbytes) {
  Bnb bnb;
  const at::Tensor code = bnb["code.nf4"];
  ASSERT_EQ(code.numel(), 16);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(Nf4CodeBook()[i], code[i].item<float>()) << i;
}

TEST(Nf4, QuantisationEqualsBitsandbytesByteForByte) {
  Bnb bnb;
  for (const std::string& w : kWeights) {
    SCOPED_TRACE(w);
    const at::Tensor x = bnb[w + ".input"].to(at::kFloat).contiguous();
    const int64_t n = x.numel();
    std::vector<uint8_t> packed(n / 2);
    std::vector<float> absmax(n / kNf4Block);
    QuantizeNf4(x.data_ptr<float>(), n, packed.data(), absmax.data());
    const at::Tensor want_packed = bnb[w + ".packed"], want_absmax = bnb[w + ".absmax"];
    ASSERT_EQ(want_packed.numel(), n / 2);
    ASSERT_EQ(want_absmax.numel(), n / kNf4Block);
    EXPECT_EQ(std::memcmp(packed.data(), want_packed.data_ptr<uint8_t>(), packed.size()), 0);
    for (int64_t i = 0; i < n / 2; ++i)
      if (packed[i] != want_packed[i].item<uint8_t>()) {
        ADD_FAILURE() << "first differing byte " << i << ": " << int(packed[i]) << " against "
                      << int(want_packed[i].item<uint8_t>());
        break;
      }
    for (int64_t b = 0; b < n / kNf4Block; ++b) EXPECT_EQ(absmax[b], want_absmax[b].item<float>()) << "block " << b;
  }
}

// Large weights quantise on the thread pool in tasks of whole blocks: the same bytes as one block at a time.
TEST(Nf4, ThreadedQuantisationEqualsBlockByBlock) {
  at::manual_seed(3);
  const int64_t n = 64 * (3 * 4096 + 5);
  const at::Tensor x = at::randn({n}) * 0.02;
  std::vector<uint8_t> packed(n / 2), one_packed(n / 2);
  std::vector<float> absmax(n / 64), one_absmax(n / 64);
  QuantizeNf4(x.data_ptr<float>(), n, packed.data(), absmax.data());
  for (int64_t b = 0; b < n / 64; ++b)
    QuantizeNf4(x.data_ptr<float>() + b * 64, 64, one_packed.data() + b * 32, one_absmax.data() + b);
  EXPECT_EQ(packed, one_packed);
  EXPECT_EQ(absmax, one_absmax);
}

// Independent of the fixture: a value exactly on a midpoint takes the lower code, the next float above it the upper.
TEST(Nf4, MidpointsGoToTheLowerCode) {
  const auto& code = Nf4CodeBook();
  for (int i = 0; i + 1 < 16; ++i) {
    const float mid = (code[i] + code[i + 1]) / 2.0f;
    EXPECT_EQ(Nf4Code(mid), i) << i;
    EXPECT_EQ(Nf4Code(std::nextafter(mid, 2.0f)), i + 1) << i;
    EXPECT_EQ(Nf4Code(code[i]), i) << i;
  }
  EXPECT_EQ(Nf4Code(-1.0f), 0);
  EXPECT_EQ(Nf4Code(1.0f), 15);
}

TEST(Nf4, DequantisationEqualsBitsandbytesBitForBit) {
  Bnb bnb;
  for (const std::string& w : kWeights) {
    SCOPED_TRACE(w);
    const at::Tensor packed = bnb[w + ".packed"], absmax = bnb[w + ".absmax"], want = bnb[w + ".dequant"];
    const int64_t n = want.numel();
    std::vector<c10::BFloat16> out(n);
    DequantizeNf4(packed.data_ptr<uint8_t>(), absmax.data_ptr<float>(), n, out.data());
    EXPECT_EQ(Bits(out), Bits(want));
  }
}

TEST(Nf4, DoubleQuantisedScalesDequantiseAsBitsandbytes) {
  Bnb bnb;
  for (const std::string& w : kWeights) {
    SCOPED_TRACE(w);
    const at::Tensor codes = bnb[w + ".dq.codes"], absmax2 = bnb[w + ".dq.absmax2"], want = bnb[w + ".dq.dequant"],
                     packed = bnb[w + ".packed"];
    const float offset = bnb[w + ".dq.offset"][0].item<float>();
    const int64_t n = want.numel(), blocks = n / kNf4Block;
    ASSERT_EQ(absmax2.numel(), (blocks + kNf4StatsBlock - 1) / kNf4StatsBlock);
    std::vector<float> absmax(blocks);
    ExpandNf4Stats(codes.data_ptr<uint8_t>(), absmax2.data_ptr<float>(), offset, blocks, absmax.data());
    std::vector<c10::BFloat16> out(n);
    DequantizeNf4(packed.data_ptr<uint8_t>(), absmax.data(), n, out.data());
    EXPECT_EQ(Bits(out), Bits(want));
  }
}

TEST(Nf4, DoubleQuantisationEqualsBitsandbytesOrIsNearer) {
  Bnb bnb;
  int64_t total = 0, differ = 0;
  for (const std::string& w : kWeights) {
    SCOPED_TRACE(w);
    const at::Tensor absmax = bnb[w + ".absmax"], want_codes = bnb[w + ".dq.codes"],
                     want_absmax2 = bnb[w + ".dq.absmax2"];
    const float want_offset = bnb[w + ".dq.offset"][0].item<float>();
    const int64_t blocks = absmax.numel();
    // The mean: torch sums in its own order; ours (in double) may differ in the last bits only.
    const float offset = Nf4StatsOffset(absmax.data_ptr<float>(), blocks);
    EXPECT_NEAR(offset, want_offset, 4 * std::fabs(want_offset) * std::numeric_limits<float>::epsilon());
    // Given bitsandbytes' offset, the statistics it stores.
    std::vector<uint8_t> codes(blocks);
    std::vector<float> absmax2(want_absmax2.numel());
    CompressNf4Stats(absmax.data_ptr<float>(), blocks, want_offset, codes.data(), absmax2.data());
    for (int64_t b = 0; b < want_absmax2.numel(); ++b) EXPECT_EQ(absmax2[b], want_absmax2[b].item<float>()) << b;
    for (int64_t i = 0; i < blocks; ++i) {
      ++total;
      const auto want = want_codes[i].item<uint8_t>();
      if (codes[i] == want) continue;
      ++differ;
      EXPECT_EQ(std::abs(int(codes[i]) - int(want)), 1) << "block " << i;
      const float a = absmax2[i / kNf4StatsBlock], v = absmax[i].item<float>() - want_offset;
      EXPECT_LE(std::fabs(SignedDynamicMap()[codes[i]] * a - v), std::fabs(SignedDynamicMap()[want] * a - v)) << i;
    }
  }
  EXPECT_LT(differ, total / 50) << "more than 2% of the statistics' codes differ from bitsandbytes'";
}

// A 70B layer's projection has millions of scales: compressed in tasks of whole statistics blocks across the thread
// pool, which must give the serial quantiser's result (three tasks and a partial fourth, a partial last block).
TEST(Nf4, CompressedStatisticsDoNotDependOnTheSplit) {
  const int64_t blocks = 3 * 1024 * kNf4StatsBlock + 1000;
  at::manual_seed(5);
  const at::Tensor absmax = at::rand({blocks}) * 0.05 + 0.01;
  const float offset = Nf4StatsOffset(absmax.data_ptr<float>(), blocks);
  std::vector<uint8_t> codes(blocks), want_codes(blocks);
  std::vector<float> absmax2((blocks + kNf4StatsBlock - 1) / kNf4StatsBlock), want_absmax2(absmax2.size());
  CompressNf4Stats(absmax.data_ptr<float>(), blocks, offset, codes.data(), absmax2.data());
  const at::Tensor centred = absmax - offset;
  QuantizeBlockwise(centred.data_ptr<float>(), blocks, SignedDynamicMap(), want_codes.data(), want_absmax2.data());
  EXPECT_EQ(codes, want_codes);
  EXPECT_EQ(absmax2, want_absmax2);
}

TEST(Nf4, TensorsRoundTripAsTheRoutines) {
  Bnb bnb;
  for (const std::string& w : kWeights) {
    SCOPED_TRACE(w);
    const at::Tensor x = bnb[w + ".input"];
    const Nf4Tensors plain = QuantizeNf4Tensor(x, /*double_quant=*/false);
    EXPECT_TRUE(at::equal(plain.packed, bnb[w + ".packed"]));
    EXPECT_TRUE(at::equal(plain.absmax, bnb[w + ".absmax"]));
    at::Tensor out = at::empty({x.numel()}, at::kBFloat16);
    DequantizeNf4Into(plain, out);
    EXPECT_EQ(Bits(out), Bits(bnb[w + ".dequant"]));
    EXPECT_EQ(plain.bytes(), x.numel() / 2 + x.numel() / kNf4Block * 4);

    const Nf4Tensors dq = QuantizeNf4Tensor(x, /*double_quant=*/true);
    ASSERT_TRUE(dq.double_quant());
    EXPECT_FALSE(dq.absmax.defined());
    std::vector<float> absmax(x.numel() / kNf4Block);
    ExpandNf4Stats(dq.stats_codes.data_ptr<uint8_t>(), dq.absmax2.data_ptr<float>(), dq.offset,
                   static_cast<int64_t>(absmax.size()), absmax.data());
    std::vector<c10::BFloat16> want(x.numel());
    DequantizeNf4(dq.packed.data_ptr<uint8_t>(), absmax.data(), x.numel(), want.data());
    DequantizeNf4Into(dq, out);
    EXPECT_EQ(Bits(out), Bits(want));
    // Double quantisation moves each scale by at most half a code step of its block: the weights stay within a few
    // percent of the plain encoding's.
    const at::Tensor plain_out = bnb[w + ".dequant"].to(at::kFloat).flatten();
    const double scale = plain_out.abs().max().item<double>();
    EXPECT_LE((out.to(at::kFloat) - plain_out).abs().max().item<double>(), 0.05 * scale + 1e-6);
  }
}

// fp32 output (fp32 compute) is the product itself; bf16 output is that product rounded to nearest even.
TEST(Nf4, Fp32OutputRoundsToTheBf16Output) {
  Bnb bnb;
  for (const std::string& w : kWeights) {
    SCOPED_TRACE(w);
    const at::Tensor packed = bnb[w + ".packed"], absmax = bnb[w + ".absmax"], want = bnb[w + ".dequant"];
    std::vector<float> out(want.numel());
    DequantizeNf4(packed.data_ptr<uint8_t>(), absmax.data_ptr<float>(), want.numel(), out.data());
    const at::Tensor rounded = at::from_blob(out.data(), {want.numel()}, at::kFloat).to(at::kBFloat16);
    EXPECT_EQ(Bits(rounded), Bits(want));
    for (int64_t i = 0; i < want.numel(); i += 97) {  // and exactly NF4[code] * absmax
      const uint8_t byte = packed[i / 2].item<uint8_t>();
      const float code = Nf4CodeBook()[i % 2 == 0 ? byte >> 4 : byte & 0xF];
      EXPECT_EQ(out[i], code * absmax[i / kNf4Block].item<float>()) << i;
    }
  }
}

TEST(Nf4, ElementCountsMustFillBlocks) {
  EXPECT_TRUE(CheckNf4Numel(4096, "w").ok());
  const Status bad = CheckNf4Numel(4096 + 32, "model.layers.3.mlp.down_proj.weight");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("model.layers.3.mlp.down_proj.weight"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("4128 elements"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("64"), std::string::npos) << bad.message();
  EXPECT_FALSE(CheckNf4Numel(0, "w").ok());
}

TEST(Nf4, CudaKernelEqualsTheCpuBitForBit_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine";
  const c10::Device cuda(c10::kCUDA, 0);
  for (int64_t n : {int64_t{64}, int64_t{64} * 257, (int64_t{1} << 22) + 64 * 3})
    for (bool double_quant : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(n) + (double_quant ? " double" : " plain"));
      at::manual_seed(n);
      at::Tensor x = at::randn({n}) * 0.03;
      x.narrow(0, 0, 64).zero_();  // a zero block
      x[n / 2] = 7.0;              // an outlier
      const Nf4Tensors host = QuantizeNf4Tensor(x.to(at::kBFloat16), double_quant);
      for (c10::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
        at::Tensor want = at::empty({n}, dtype);
        DequantizeNf4Into(host, want);
        at::Tensor got = at::empty({n}, at::TensorOptions().dtype(dtype).device(cuda));
        DequantizeNf4Into(host.To(cuda), got);
        EXPECT_TRUE(at::equal(got.cpu().view(dtype == at::kFloat ? at::kInt : at::kShort),
                              want.view(dtype == at::kFloat ? at::kInt : at::kShort)));
      }
    }
  // Every code with every kind of scale: random packed bytes and scales, plain.
  const int64_t n = 64 * 1024;
  Nf4Tensors w;
  w.numel = n;
  w.packed = at::randint(0, 256, {n / 2}, at::kByte);
  w.absmax = at::rand({n / 64}) * 3;
  at::Tensor want = at::empty({n}, at::kBFloat16), got = at::empty({n}, at::kBFloat16).to(cuda);
  DequantizeNf4Into(w, want);
  DequantizeNf4Into(w.To(cuda), got);
  EXPECT_EQ(Bits(got.cpu()), Bits(want));
}

}  // namespace
}  // namespace slide
