// The sliding trainer's adapter mode (LoRA over a frozen base, the host standing in for the device) against the
// LoRA reference trainer: bit-identical losses, gradient norms and adapters on the CPU over windows smaller than
// the model, accumulation, clipping, dropout, tied embeddings and bf16; the state round trip a checkpoint takes;
// the options adapter mode refuses. On CUDA the same runs within bf16's tolerances. With an NF4 base (QLoRA) the
// reference trains on the base quantised and dequantised by the same routines (nf4_test.cc checks them against
// bitsandbytes), so the sliding path still equals it bit for bit on the CPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/quant/nf4_unit.h"
#include "engine/runtime/adapter_store.h"
#include "engine/runtime/lora_reference_trainer.h"
#include "engine/runtime/sliding_trainer.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

using testing::ModelFixture;
using testing::ValueOrDie;

struct LoraCase {
  std::string arch;
  c10::ScalarType dtype;
  int64_t window;
  int64_t accum;
  double max_grad_norm;
  double dropout = 0;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  std::optional<Nf4BaseOptions> nf4{};  // QLoRA
  bool prequantized = false;            // NF4 layers handed to the trainer already quantised
};

TrainerOptions Options(const LoraCase& c, c10::Device device) {
  TrainerOptions o;
  o.adamw = {.lr = 0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  o.schedule = {.kind = LrScheduleKind::kCosine, .peak_lr = 3e-3, .warmup_steps = 2, .total_steps = 12};
  o.max_grad_norm = c.max_grad_norm;
  o.compute_dtype = c.dtype;
  o.device = device;
  o.loss.chunk_tokens = 24;
  return o;
}

std::vector<MicroBatch> Batch(int64_t step, int64_t accum, int64_t vocab, c10::Device device) {
  return testing::RandomMicroBatches(2000 + step, accum, vocab, device);
}

ModelParams FourLayers(const ModelFixture& fx, ModelConfig* cfg) { return testing::RepeatedLayers(fx, cfg, 4); }

at::Tensor HostBuffer(int64_t numel, c10::ScalarType dtype) { return at::empty({numel}, dtype); }

// The decoder layers of `base` (as the trainer gets them) in NF4.
std::vector<Nf4Unit> QuantizedLayers(const ModelParams& base, const Nf4BaseOptions& nf4) {
  std::vector<Nf4Unit> layers;
  for (int64_t l = 0; l < base.layout.num_layers(); ++l)
    layers.push_back(QuantizeNf4Unit(base.layout.layer(l), base.units[1 + l], nf4.double_quant,
                                     base.units[1 + l].scalar_type(), HostBuffer));
  return layers;
}

// What the reference trains on: `base` with each layer quantised and dequantised (fp32, the products unrounded).
ModelParams DequantisedBase(const ModelParams& base, const Nf4BaseOptions& nf4) {
  ModelParams out = base.To(at::TensorOptions().dtype(at::kFloat));
  const std::vector<Nf4Unit> layers = QuantizedLayers(base, nf4);
  for (int64_t l = 0; l < base.layout.num_layers(); ++l)
    DequantizeNf4Unit(base.layout.layer(l), layers[l], out.units[1 + l]);
  return out;
}

// An adapter whose B is not zero, so every gradient is non-zero from the first step.
std::vector<at::Tensor> StartingAdapter(const AdapterLayout& layout, uint64_t seed) {
  std::vector<at::Tensor> a = InitAdapter(layout, seed);
  at::manual_seed(99);
  for (size_t i = 0; i < a.size(); ++i)
    for (const ParamSpec& p : layout.layers[i].params)
      if (p.local.find("lora_B") != std::string::npos) ParamView(p, a[i]).normal_(0, 0.05);
  return a;
}

void RunLoraEquivalence(const LoraCase& c, c10::Device device) {
  ModelFixture fx = ModelFixture::Load(c.arch);
  ModelConfig cfg = fx.config;
  const ModelParams base = FourLayers(fx, &cfg);
  LoraOptions lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.dropout = c.dropout;
  lora.target_modules = c.targets;
  lora.seed = 5;
  const AdapterLayout layout = BuildAdapterLayout(cfg, lora);
  const std::vector<at::Tensor> start = StartingAdapter(layout, lora.seed);

  const TrainerOptions o = Options(c, device);
  ModelParams given = base.To(at::TensorOptions().dtype(c.dtype));  // what the trainer loads
  LoraReferenceTrainer ref(cfg, c.nf4 ? DequantisedBase(given, *c.nf4) : base, start, lora, o);
  SlidingOptions so{.train = o, .window = c.window, .checkpoints_on_host = device.is_cuda()};
  so.adapter = lora;
  so.nf4_base = c.nf4;
  std::vector<Nf4Unit> nf4_layers;
  if (c.prequantized) {
    nf4_layers = QuantizedLayers(given, *c.nf4);
    for (int64_t l = 0; l < cfg.num_layers; ++l) given.units[1 + l] = at::Tensor();
  }
  SlidingTrainer slide(cfg, std::move(given), so, nullptr, std::move(nf4_layers));
  ASSERT_EQ(slide.state_units(), static_cast<size_t>(cfg.num_layers));
  for (int64_t i = 0; i < cfg.num_layers; ++i) ASSERT_OK(slide.WriteState(0, i, start[i]));

  const bool exact = device.is_cpu();
  double worst_loss = 0, worst_norm = 0;
  for (int64_t s = 0; s < 12; ++s) {
    auto mbs = Batch(s, c.accum, cfg.vocab_size, device);
    StepStats a = ref.Step(mbs), b = ValueOrDie(slide.Step(mbs));
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.lr, b.lr);
    if (exact) {
      EXPECT_EQ(a.loss, b.loss) << "step " << s;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    }
    worst_loss = std::max(worst_loss, std::abs(a.loss - b.loss) / a.loss);
    worst_norm = std::max(worst_norm, std::abs(a.grad_norm - b.grad_norm) / a.grad_norm);
  }
  double worst_update = 0;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    at::Tensor ours = ValueOrDie(slide.ReadState(0, i)), theirs = ref.adapter()[i].cpu();
    if (exact) {
      EXPECT_TRUE(at::equal(ours, theirs)) << "layer " << i;
    } else {
      worst_update = std::max(worst_update, testing::Compare(ours - start[i], theirs - start[i]).norm_rel);
    }
  }
  if (!exact) {  // bf16 on the GPU: the sliding and whole-graph runs reduce in different orders
    EXPECT_LE(worst_loss, 5e-3);
    EXPECT_LE(worst_norm, 5e-2);
    EXPECT_LE(worst_update, 5e-2);
  }
  // The evaluation forward uses no dropout and the trained adapters: the reference's logits give the same loss.
  auto eval = Batch(100, 1, cfg.vocab_size, device);
  const double eval_loss = ValueOrDie(slide.EvalLoss(eval));
  EXPECT_GT(eval_loss, 0);
  std::printf(
      "SLIDING-%s %-8s %s window %lld accum %lld clip %.1f dropout %.2f: loss rel %.2e norm rel %.2e "
      "adapter updates norm-rel %.2e (%s)\n",
      c.nf4 ? "QLORA" : "LORA", c.arch.c_str(), c.dtype == c10::kFloat ? "fp32" : "bf16", (long long)c.window,
      (long long)c.accum, c.max_grad_norm, c.dropout, worst_loss, worst_norm, worst_update,
      exact ? "bit-identical" : "cuda");
}

TEST(SlidingLora, EqualsLoraReferenceFp32WithAccumulationAndClipping) {
  RunLoraEquivalence({"llama3", c10::kFloat, 2, 2, 1.0}, c10::Device(c10::kCPU));
}

TEST(SlidingLora, EqualsLoraReferenceTiedEmbeddingsOneSlotWithDropout) {
  RunLoraEquivalence({"qwen2", c10::kFloat, 1, 2, 0.5, 0.1}, c10::Device(c10::kCPU));
}

TEST(SlidingLora, EqualsLoraReferenceBf16AttentionOnlyWithoutClipping) {
  RunLoraEquivalence({"qwen3", c10::kBFloat16, 2, 1, 0.0, 0.05, {"q_proj", "v_proj"}}, c10::Device(c10::kCPU));
}

TEST(SlidingLora, EqualsLoraReferenceWholeModelInTheWindow) {
  RunLoraEquivalence({"mistral", c10::kBFloat16, 4, 1, 1.0}, c10::Device(c10::kCPU));
}

TEST(SlidingLora, EqualsLoraReferenceBf16_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine";
  RunLoraEquivalence({"llama3", c10::kBFloat16, 2, 2, 1.0, 0.05}, c10::Device(c10::kCUDA, 0));
}

TEST(SlidingQLora, EqualsLoraReferenceOnTheDequantisedBaseFp32) {
  LoraCase c{"llama3", c10::kFloat, 2, 2, 1.0};
  c.nf4 = Nf4BaseOptions{.double_quant = true};
  RunLoraEquivalence(c, c10::Device(c10::kCPU));
}

TEST(SlidingQLora, EqualsLoraReferenceBf16PlainScalesPrequantisedOneSlot) {
  LoraCase c{"qwen3", c10::kBFloat16, 1, 1, 0.5, 0.05};
  c.nf4 = Nf4BaseOptions{.double_quant = false};
  c.prequantized = true;
  RunLoraEquivalence(c, c10::Device(c10::kCPU));
}

TEST(SlidingQLora, EqualsLoraReferenceBf16_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine";
  LoraCase c{"llama3", c10::kBFloat16, 2, 2, 1.0, 0.05};
  c.nf4 = Nf4BaseOptions{};
  c.prequantized = true;
  RunLoraEquivalence(c, c10::Device(c10::kCUDA, 0));
}

// The host holds the layers' NF4 arrays only: about 0.53 bytes a projection weight with double quantisation.
TEST(SlidingQLora, HostHoldsTheNf4ArraysNotTheBase) {
  ModelFixture fx = ModelFixture::Load("mistral");
  ModelConfig cfg = fx.config;
  const ModelParams base = FourLayers(fx, &cfg);
  SlidingOptions so{.window = 2};
  so.train.compute_dtype = c10::kBFloat16;
  so.adapter = LoraOptions{};
  so.nf4_base = Nf4BaseOptions{};
  const std::vector<Nf4Unit> layers = QuantizedLayers(base.To(at::TensorOptions().dtype(c10::kBFloat16)), *so.nf4_base);
  int64_t projections = 0, rest = 0, bytes = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    bytes += layers[l].bytes();
    EXPECT_EQ(layers[l].bytes(), Nf4UnitBytes(base.layout.layer(l), /*double_quant=*/true, 2));
    for (const ParamSpec& p : base.layout.layer(l).params) (p.shape.size() == 2 ? projections : rest) += p.numel;
  }
  // 4 bits a weight, a byte per 64 weights, 4 bytes per 16,384 (one per projection here), 2 bytes a norm weight.
  EXPECT_LE(bytes, projections / 2 + projections / 64 + 4 * 7 * cfg.num_layers + 2 * rest);
  EXPECT_GE(bytes, projections / 2);
}

TEST(SlidingQLora, RefusesAnNf4BaseWithoutAdapterOrOutsideWholeBlocks) {
  ModelFixture fx = ModelFixture::Load("llama3");
  SlidingOptions so;
  so.nf4_base = Nf4BaseOptions{};
  const Status no_adapter = ValidateSlidingOptions(so, BuildModelLayout(fx.config));
  EXPECT_EQ(no_adapter.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_adapter.message().find("adapter"), std::string::npos) << no_adapter.message();
  so.adapter = LoraOptions{};
  ASSERT_OK(ValidateSlidingOptions(so, BuildModelLayout(fx.config)));
  ModelConfig odd = fx.config;  // 30 x 30 projections: 900 weights, not whole blocks of 64
  odd.hidden_size = 30;
  odd.num_heads = 3;
  odd.num_kv_heads = 1;
  odd.head_dim = 10;
  odd.intermediate_size = 30;
  const Status bad = ValidateSlidingOptions(so, BuildModelLayout(odd));
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("model.layers.0.self_attn.q_proj.weight has 900 elements"), std::string::npos)
      << bad.message();
}

TEST(SlidingLora, RefusesWhatAdapterModeDoesNotDo) {
  ModelFixture fx = ModelFixture::Load("llama3");
  const ModelLayout layout = BuildModelLayout(fx.config);
  SlidingOptions so;
  so.adapter = LoraOptions{};
  ASSERT_OK(ValidateSlidingOptions(so, layout));
  SlidingOptions bad = so;
  bad.resident_layers = 1;
  EXPECT_EQ(ValidateSlidingOptions(bad, layout).code(), StatusCode::kInvalidArgument);
  bad = so;
  bad.device_update_share = 0.3;
  bad.train.compute_dtype = c10::kBFloat16;
  EXPECT_EQ(ValidateSlidingOptions(bad, layout).code(), StatusCode::kInvalidArgument);
  bad = so;
  bad.train.optimizer = OptimizerKind::kAdamW8bit;
  EXPECT_EQ(ValidateSlidingOptions(bad, layout).code(), StatusCode::kInvalidArgument);
}

// The base stays as loaded: a step changes the adapters only, and the state a checkpoint takes restores a trainer
// that goes on exactly as the first.
TEST(SlidingLora, CheckpointStateRestoresExactly) {
  ModelFixture fx = ModelFixture::Load("llama32");
  ModelConfig cfg = fx.config;
  const ModelParams base = FourLayers(fx, &cfg);
  SlidingOptions so{.train = Options({"llama32", c10::kFloat, 2, 1, 1.0}, c10::Device(c10::kCPU)), .window = 2};
  so.adapter = LoraOptions{.r = 2, .alpha = 4, .dropout = 0.1};
  SlidingTrainer a(cfg, base, so);
  for (int64_t s = 0; s < 3; ++s) ASSERT_TRUE(a.Step(Batch(s, 1, cfg.vocab_size, c10::Device(c10::kCPU))).ok());
  SlidingTrainer b(cfg, base, so);
  for (int kind = 0; kind < 3; ++kind)
    for (size_t u = 0; u < a.state_units(); ++u) ASSERT_OK(b.WriteState(kind, u, ValueOrDie(a.ReadState(kind, u))));
  b.StateRestored(a.steps_taken());
  for (int64_t s = 3; s < 6; ++s) {
    auto mbs = Batch(s, 1, cfg.vocab_size, c10::Device(c10::kCPU));
    StepStats sa = ValueOrDie(a.Step(mbs)), sb = ValueOrDie(b.Step(mbs));
    EXPECT_EQ(sa.loss, sb.loss);
    EXPECT_EQ(sa.grad_norm, sb.grad_norm);
  }
  EXPECT_EQ(a.WriteState(0, 0, at::zeros({3})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.WriteState(0, 99, at::zeros({3})).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace slide
